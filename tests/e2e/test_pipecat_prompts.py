"""Navigation prompts (`ChatTTSSegmentFrame`) through the Pipecat adapter in a real Pipecat
pipeline, against the real server (tiny dev model, loopback; the agent side in its own venv, as
in test_pipecat_adapter.py). Revised with no interruption: the revision is heard in the prompt's
own turn, right after what the server kept of the old text, a revision never spoken adds no
frames, and one the server queues behind its ended prompt plays in a context of its own.
"""

from __future__ import annotations

import json

import pytest

from clientvenv import PIPECAT_AI, client_floor_pins, client_venv, run_in
from pipecat_scripts import SCRIPT_HELPERS, reference_bytes

pytestmark = pytest.mark.slow


_PROMPTS = r"""
import asyncio, json, sys, time
from loguru import logger
logger.remove()
logger.add(sys.stderr, level="WARNING")
from pipecat.frames.frames import (ErrorFrame, InterruptionFrame, TTSAudioRawFrame,
    TTSStartedFrame, TTSStoppedFrame)
from pipecat.observers.base_observer import BaseObserver
from pipecat.tests.utils import SleepFrame, run_test
from chattts_client import SynthesisOptions
from chattts_client.pipecat import ChatTTSSegmentFrame, ChatTTSTTSService

target, num_tokens, texts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
options = SynthesisOptions(voice=7, seed=3, max_new_tokens=num_tokens, min_new_tokens=num_tokens)

async def main():
    tts = ChatTTSTTSService(target, options)
    ends = []

    @tts.event_handler("on_segment_end")
    async def on_segment_end(service, name, event):
        ends.append({"name": name, "revision": event.revision, "outcome": event.outcome,
                     "sample_offset": event.sample_offset})

    seen = Seen(tts)

    def frames():
        yield ChatTTSSegmentFrame(texts["long"], segment="nav")
        yield from wait_until(lambda: seen.audio >= 2)  # the prompt is being spoken
        yield ChatTTSSegmentFrame(texts["update"], segment="nav", if_started="cut")
        yield from wait_until(lambda: seen.stopped >= 1)  # the prompt's turn has ended
        # The prompt has ended: its next text is a turn of its own, at once revised again
        # (before it starts).
        yield ChatTTSSegmentFrame(texts["again"], segment="nav")
        yield ChatTTSSegmentFrame(texts["last"], segment="nav", if_started="finish")
        yield from wait_until(lambda: seen.stopped >= 2)
        yield from wait_until(lambda: len(ends) >= 4, timeout_s=5.0)
        # A barge-in while another prompt speaks clears it as any turn; its name then starts
        # a new prompt.
        num_audio = seen.audio
        yield ChatTTSSegmentFrame(texts["long"], segment="exit")
        yield from wait_until(lambda: seen.audio >= num_audio + 2)
        yield InterruptionFrame()
        yield ChatTTSSegmentFrame(texts["exit"], segment="exit")
        yield from wait_until(lambda: seen.stopped >= 3)
        yield from wait_until(lambda: len(ends) >= 6, timeout_s=5.0)

    down, up = await run_test(tts, frames_to_send=frames(), observers=[seen])
    out = []
    for f in down:
        if isinstance(f, TTSAudioRawFrame):
            out.append({"t": "audio", "ctx": f.context_id, "bytes": len(f.audio), "rate": f.sample_rate})
        elif isinstance(f, (TTSStartedFrame, TTSStoppedFrame)):
            out.append({"t": type(f).__name__, "ctx": f.context_id})
        elif isinstance(f, InterruptionFrame):
            out.append({"t": "interruption"})
    print(json.dumps({"frames": out, "errors": [f.error for f in up if isinstance(f, ErrorFrame)],
                      "ends": ends}))

asyncio.run(main())
"""

PROMPT_TOKENS = 120
# Each sentence one utterance: no commas (the server may release a clause early), and under
# four words where speech starts from silence (its first words are released early).
PROMPTS = {
    "long": " ".join(f"In {n}00 m turn left." for n in range(9, 3, -1)),  # six sentences
    "update": "In 100 m turn left.",
    "again": "Turn left now.",
    "last": "Now turn left onto the ramp.",
    "exit": "Take the exit.",
}


def test_prompt_revised_without_interruption(server):
    """A ChatTTSSegmentFrame speaking, then a revision of it with "cut" and no
    InterruptionFrame: the old text stops where the server cut it, and the new one follows in
    the same turn (one context, one start and one stop). Once that prompt has ended, a frame of
    the same name is a turn of its own; revised before it starts, only the revision is heard.
    Every utterance is PROMPT_TOKENS long, so each context's audio is known to the byte from
    the segment ends' offsets. Last, an InterruptionFrame still clears a prompt speaking."""
    python = client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])
    out = run_in(
        python, SCRIPT_HELPERS + _PROMPTS, server.target, str(PROMPT_TOKENS), json.dumps(PROMPTS)
    )
    result = json.loads(out.strip().splitlines()[-1])
    frames, ends = result["frames"], result["ends"]
    assert not result["errors"], result["errors"]
    kinds = [f["t"] for f in frames]
    cut = kinds.index("interruption")  # only the one pushed at the end
    assert "interruption" not in kinds[cut + 1 :], kinds

    # Four contexts, one after another: each its start, its audio and its stop (none for the
    # third: Pipecat drops an interrupted context).
    shown = [f for f in frames if f["t"] != "interruption"]
    contexts = list(dict.fromkeys(f["ctx"] for f in shown))
    assert len(contexts) == 4, frames
    assert [f["ctx"] for f in shown] == sorted((f["ctx"] for f in shown), key=contexts.index)
    for k, ctx in enumerate(contexts):
        ctx_kinds = [f["t"] for f in shown if f["ctx"] == ctx]
        stop = [] if k == 2 else ["TTSStoppedFrame"]
        audio = ctx_kinds[1 : len(ctx_kinds) - len(stop)]
        assert ctx_kinds == ["TTSStartedFrame", *audio, *stop] and set(audio) == {"audio"}, k
    assert {f["ctx"] for f in frames[:cut]} == set(contexts[:3]), "the cut is in the third"
    assert all(f["rate"] == 24000 for f in frames if f["t"] == "audio")
    first, second, _, fourth = (
        sum(f["bytes"] for f in shown if f["ctx"] == ctx and f["t"] == "audio") for ctx in contexts
    )

    # Each revision ended once: the long text cut, its update spoken, the next prompt's first
    # text replaced before it started, its revision spoken; then the prompt a barge-in cut
    # (the next of its name is spoken: a revision, or a new segment if the cut's end had not
    # come back yet).
    outcomes = [(e["name"], e["revision"], e["outcome"]) for e in ends]
    assert outcomes[:5] == [
        ("nav", 0, "cut"),
        ("nav", 1, "spoken"),
        ("nav", 2, "replaced"),
        ("nav", 3, "spoken"),
        ("exit", 0, "cut"),
    ], outcomes
    assert [(e["name"], e["outcome"]) for e in ends[5:]] == [("exit", "spoken")], outcomes
    one = reference_bytes(server.target, PROMPTS["update"], PROMPT_TOKENS)
    cut_bytes = 2 * ends[0]["sample_offset"]  # LINEAR16: the stream's audio starts at 0
    # The first context: the long text up to the cut, then the update whole; nothing more.
    assert first == cut_bytes + one, (first, cut_bytes, one)
    assert 2 * ends[1]["sample_offset"] == first
    # Cut early: six sentences were queued, the update came at the second audio frame.
    assert 0 < cut_bytes < 3 * one, (cut_bytes, one)
    # The second: only the revision; the replaced text made no sound.
    assert 2 * ends[2]["sample_offset"] == first
    assert second == one and 2 * ends[3]["sample_offset"] == first + second
    # After the barge-in: exactly the new prompt, none of the cleared one's audio.
    assert fourth == one == 2 * (ends[5]["sample_offset"] - ends[4]["sample_offset"])


_LATE_END = r"""
import asyncio, json, sys, time
from loguru import logger
logger.remove()
logger.add(sys.stderr, level="WARNING")
from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame
from pipecat.observers.base_observer import BaseObserver
from pipecat.tests.utils import SleepFrame, run_test
from chattts_client import SynthesisOptions
from chattts_client.pipecat import ChatTTSSegmentFrame, ChatTTSTTSService

target, num_tokens, first, update = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
options = SynthesisOptions(voice=7, seed=3, max_new_tokens=num_tokens, min_new_tokens=num_tokens)

class LateEnd(ChatTTSTTSService):
    # The prompt's first end reaches the service only after its revision is sent (the race
    # where the server ends the old text as the replace is on its way): held back for good.
    async def _on_segment_end(self, event):
        if event.revision > 0:
            await super()._on_segment_end(event)

async def main():
    tts = LateEnd(target, options)
    ends = []

    @tts.event_handler("on_segment_end")
    async def on_segment_end(service, name, event):
        ends.append([name, event.revision, event.outcome])

    seen = Seen(tts)

    def frames():
        yield ChatTTSSegmentFrame(first, segment="ramp")
        yield from wait_until(lambda: seen.stopped >= 1)  # spoken, its turn ended
        yield ChatTTSSegmentFrame(update, segment="ramp")
        yield from wait_until(lambda: seen.stopped >= 2)

    down, up = await run_test(tts, frames_to_send=frames(), observers=[seen])
    out = []
    for f in down:
        if isinstance(f, TTSAudioRawFrame):
            out.append({"t": "audio", "ctx": f.context_id, "bytes": len(f.audio)})
        elif isinstance(f, (TTSStartedFrame, TTSStoppedFrame)):
            out.append({"t": type(f).__name__, "ctx": f.context_id})
    print(json.dumps({"frames": out, "errors": [f.error for f in up if isinstance(f, ErrorFrame)],
                      "ends": ends}))

asyncio.run(main())
"""


def test_revision_of_a_prompt_the_server_had_ended(server):
    """A revision sent while the service still counts its prompt as speaking, which the server
    has ended meanwhile: the server queues it after everything sent before it, and the service
    plays it in a context of its own, opened at its first audio, ended at its own mark."""
    python = client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])
    first, update = PROMPTS["again"], PROMPTS["update"]
    out = run_in(
        python, SCRIPT_HELPERS + _LATE_END, server.target, str(PROMPT_TOKENS), first, update
    )
    result = json.loads(out.strip().splitlines()[-1])
    frames = result["frames"]
    assert not result["errors"], result["errors"]
    assert result["ends"] == [["ramp", 1, "spoken"]], result["ends"]
    contexts = list(dict.fromkeys(f["ctx"] for f in frames))
    assert len(contexts) == 2, frames
    one = reference_bytes(server.target, update, PROMPT_TOKENS)
    for ctx in contexts:
        kinds = [f["t"] for f in frames if f["ctx"] == ctx]
        assert kinds[0] == "TTSStartedFrame" and kinds[-1] == "TTSStoppedFrame", kinds
        assert set(kinds[1:-1]) == {"audio"}, kinds
        assert sum(f["bytes"] for f in frames if f["ctx"] == ctx and f["t"] == "audio") == one
    assert [f["ctx"] for f in frames] == sorted((f["ctx"] for f in frames), key=contexts.index)
