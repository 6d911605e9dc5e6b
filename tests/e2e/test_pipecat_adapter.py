"""The Pipecat adapter (chattts_client.pipecat) in a real Pipecat pipeline, against the real
server (tiny dev model, loopback): barge-in, turns ending at their marks, a refused token, and
the README example. Navigation prompts (`ChatTTSSegmentFrame`) are in test_pipecat_prompts.py.

pipecat-ai needs protobuf<7 and our server protobuf>=7.35, so the agent side runs in a venv of
its own (tests/helpers/clientvenv.py: the client's lowest declared protobuf and grpcio, plus
pipecat-ai), as a real agent process runs apart from the TTS server. The pipeline is run with
Pipecat's own test utility (`pipecat.tests.utils.run_test`): LLM text frames stream in, an
interruption arrives once the first turn's audio flows (the frames wait for it) while its
generation still runs, a second turn follows, and the frames that come out are checked: turn
boundaries, no first-turn audio after the interruption, and exactly the second turn's audio
(every utterance is a fixed number of tokens, so its length is known from a Synthesize of the
same text), with its words. Turns end at the stream's marks: back-to-back turns, one of which
makes no sound, each end with exactly their own audio and words, each once its mark has come
back.
"""

from __future__ import annotations

import json
import logging
import time
import wave
from dataclasses import replace

import pytest

from chattts_server.config import SecurityConfig
from clientvenv import PIPECAT_AI, REPO, client_floor_pins, client_venv, run_in
from pipecat_scripts import SCRIPT_HELPERS, reference_bytes
from serverutil import DEV_MODEL_CACHE, InProcessServer, free_port, tiny_server_config

pytestmark = pytest.mark.slow

NUM_TOKENS = 240  # every utterance: min_new_tokens == max_new_tokens (about 5 s of audio)
SECOND_TURN = "Second turn."

_PIPELINE = r"""
import asyncio, json, sys, time
from loguru import logger
logger.remove()
logger.add(sys.stderr, level="WARNING")
from pipecat.frames.frames import (
    ErrorFrame, InterruptionFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame,
    LLMTextFrame, MetricsFrame, TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame, TTSTextFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test
from chattts_client import ClientOptions, SynthesisOptions
from chattts_client.pipecat import ChatTTSTTSService

target, dead_target, num_tokens, second_turn = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
options = SynthesisOptions(voice=7, seed=3, max_new_tokens=num_tokens, min_new_tokens=num_tokens)

async def main():
    tts = ChatTTSTTSService(target, options)
    first = " ".join(f"Sentence number {n} of the first turn." for n in range(1, 9))
    seen = Seen(tts)

    def frames():  # run_test pulls these as it goes, so waits can follow the pipeline
        yield LLMFullResponseStartFrame()
        yield from tokens(first)
        yield from wait_until(lambda: seen.audio >= 3, timeout_s=30.0)  # being spoken
        yield InterruptionFrame()
        yield SleepFrame(sleep=0.3)
        yield LLMFullResponseStartFrame()
        yield from tokens(second_turn)
        yield LLMFullResponseEndFrame()
        yield from wait_until(lambda: seen.stopped >= 1, timeout_s=30.0)  # second turn ended

    down, up = await run_test(tts, frames_to_send=frames(), observers=[seen],
                              pipeline_params=PipelineParams(enable_metrics=True))
    out = []
    for f in down:
        if isinstance(f, TTSAudioRawFrame):
            out.append({"t": "audio", "ctx": f.context_id, "bytes": len(f.audio), "rate": f.sample_rate})
        elif isinstance(f, (TTSStartedFrame, TTSStoppedFrame)):
            out.append({"t": type(f).__name__, "ctx": f.context_id})
        elif isinstance(f, TTSTextFrame):
            out.append({"t": "word", "ctx": f.context_id, "text": f.text, "pts": f.pts})
        elif isinstance(f, InterruptionFrame):
            out.append({"t": "interruption"})
        elif isinstance(f, MetricsFrame):
            for d in f.data:
                if isinstance(d, TTFBMetricsData) and d.processor == str(tts):
                    out.append({"t": "ttfb", "value": d.value})
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    # Unreachable server: a clear error, upstream, at start, once the client's retries (about
    # 1.5 s of backoff, what rides out a replica restarting) are spent: past run_test's 1 s.
    dead = ChatTTSTTSService(dead_target, options, connect_timeout_s=2.0)
    _, dead_up = await run_test(dead, frames_to_send=[SleepFrame(sleep=0.1)], start_timeout=10)
    dead_errors = [f.error for f in dead_up if isinstance(f, ErrorFrame)]
    print(json.dumps({"frames": out, "errors": errors, "dead_errors": dead_errors}))

asyncio.run(main())
"""


def _streams_logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """The server's log line of each StreamingSynthesize call that ended, as key=value pairs."""
    return [
        dict(kv.split("=", 1) for kv in r.getMessage().split()[1:] if "=" in kv)
        for r in caplog.records
        if r.getMessage().startswith("stream method=StreamingSynthesize ")
    ]


def test_pipeline_with_barge_in(server, caplog):
    caplog.set_level(logging.INFO)
    python = client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])
    out = run_in(
        python,
        SCRIPT_HELPERS + _PIPELINE,
        server.target,
        f"127.0.0.1:{free_port()}",
        str(NUM_TOKENS),
        SECOND_TURN,
    )
    result = json.loads(out.strip().splitlines()[-1])
    frames = result["frames"]
    kinds = [f["t"] for f in frames]
    assert not result["errors"], result["errors"]

    # Turn 1: started, audio, then the interruption (no stop frame: Pipecat dropped the context).
    cut = kinds.index("interruption")
    before, after = frames[:cut], frames[cut + 1 :]
    assert [f["t"] for f in before if f["t"] != "ttfb"][0] == "TTSStartedFrame", kinds
    assert "TTSStoppedFrame" not in kinds[:cut], kinds
    first_ctx = next(f["ctx"] for f in before if f["t"] == "TTSStartedFrame")
    first_audio = [f for f in before if f["t"] == "audio"]
    assert first_audio and all(f["ctx"] == first_ctx for f in first_audio)
    one_utterance = reference_bytes(server.target, SECOND_TURN, NUM_TOKENS)
    assert one_utterance > 0
    # Eight utterances (at least) were sent, about 4 s of generation here; the interruption
    # after 1 s stopped the rest (a bound with room for a faster machine).
    assert sum(f["bytes"] for f in first_audio) < 6 * one_utterance, len(first_audio)

    # Turn 2: a new context, its audio and words only, then its stop frame; nothing of turn 1.
    shown = [f["t"] for f in after if f["t"] != "ttfb"]
    assert shown[0] == "TTSStartedFrame" and shown[-1] == "TTSStoppedFrame", shown
    assert set(shown[1:-1]) == {"audio", "word"}, shown
    second_ctx = after[[f["t"] for f in after].index("TTSStartedFrame")]["ctx"]
    assert second_ctx != first_ctx
    second_audio = [f for f in after if f["t"] == "audio"]
    assert all(f["ctx"] == second_ctx for f in second_audio)
    assert all(f["rate"] == 24000 for f in first_audio + second_audio)
    # Exactly one utterance of audio: any leaked first-turn audio would make it longer.
    assert sum(f["bytes"] for f in second_audio) == one_utterance
    # Its words, from the stream's word timing, in the LLM's text and timed in order.
    words = [f for f in after if f["t"] == "word"]
    assert [w["text"] for w in words] == SECOND_TURN.split(), words
    assert all(w["ctx"] == second_ctx for w in words)
    assert words[0]["pts"] < words[1]["pts"], words

    # Time to first byte is reported for each turn (right after its start frame), plausibly.
    ttfb = [frames[i + 1] for i, k in enumerate(kinds[:-1]) if k == "TTSStartedFrame"]
    assert [f["t"] for f in ttfb] == ["ttfb", "ttfb"], kinds
    # Plausibly: under the service's 10 s stop_frame_timeout_s, past which Pipecat would have
    # given the context up (5 s was exceeded once, 6.3 s, with the machine at load 20).
    assert all(0 < f["value"] < 10 for f in ttfb), ttfb

    assert any("unreachable" in e for e in result["dead_errors"]), result["dead_errors"]

    # On the server: one stream for the whole conversation, ended cleanly (no reconnect at the
    # barge-in), and the clear stopped generation: without it, all nine utterances are spoken.
    deadline = time.monotonic() + 10
    while not _streams_logged(caplog) and time.monotonic() < deadline:
        time.sleep(0.05)
    (stream,) = _streams_logged(caplog)
    assert stream["status"] == "OK", stream
    utterance_s = one_utterance / 2 / 24000
    assert float(stream["audio_s"]) < 7 * utterance_s, (stream, utterance_s)


def test_readme_example_runs(server, tmp_path):
    python = client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])
    out = tmp_path / "pipecat.wav"
    script = REPO / "examples" / "pipecat_say.py"
    code = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    printed = run_in(
        python,
        code,
        str(script),
        "--target",
        server.target,
        "--max-new-tokens",
        "24",
        "--out",
        str(out),
    )
    assert f"wrote {out}" in printed
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() > 0


_TURNS = r"""
import asyncio, json, sys, time
from loguru import logger
logger.remove()
from pipecat.frames.frames import (ErrorFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame,
    LLMTextFrame, TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame, TTSTextFrame)
from pipecat.observers.base_observer import BaseObserver
from pipecat.tests.utils import SleepFrame, run_test
from chattts_client import SynthesisOptions
from chattts_client.pipecat import ChatTTSTTSService

target, num_tokens, turns = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])

class MarksAtStop(BaseObserver):  # the marks the stream had received as each stop frame left
    def __init__(self, tts):
        super().__init__()
        self.tts, self.seen = tts, []

    async def on_push_frame(self, data):
        if data.source is self.tts and isinstance(data.frame, TTSStoppedFrame):
            self.seen.append([m.name for m in self.tts._turns.stream.timeline.marks])

async def main():
    options = SynthesisOptions(voice=7, seed=3, max_new_tokens=num_tokens, min_new_tokens=num_tokens)
    tts = ChatTTSTTSService(target, options)
    marks = MarksAtStop(tts)

    def frames():  # every turn at once, as fast as an LLM could stream them
        for text in turns:
            yield LLMFullResponseStartFrame()
            yield from tokens(text)
            yield LLMFullResponseEndFrame()
        deadline = time.monotonic() + 60
        while len(marks.seen) < len(turns) and time.monotonic() < deadline:
            yield SleepFrame(sleep=0.05)

    down, up = await run_test(tts, frames_to_send=frames(), observers=[marks])
    out = []
    for f in down:
        if isinstance(f, TTSAudioRawFrame):
            out.append({"t": "audio", "ctx": f.context_id, "bytes": len(f.audio)})
        elif isinstance(f, (TTSStartedFrame, TTSStoppedFrame)):
            out.append({"t": type(f).__name__, "ctx": f.context_id})
        elif isinstance(f, TTSTextFrame):
            out.append({"t": "word", "ctx": f.context_id, "text": f.text})
    print(json.dumps({"frames": out, "errors": [f.error for f in up if isinstance(f, ErrorFrame)],
                      "marks_at_stop": marks.seen}))

asyncio.run(main())
"""

TURNS_TOKENS = 60
# Back-to-back turns; the second makes no sound (a horizontal rule is markup, not speech).
TURNS = ["First turn here.", "\n---\n", "Third turn."]


def test_turns_end_at_their_marks_with_their_own_audio_and_words(server):
    python = client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])
    out = run_in(
        python, SCRIPT_HELPERS + _TURNS, server.target, str(TURNS_TOKENS), json.dumps(TURNS)
    )
    result = json.loads(out.strip().splitlines()[-1])
    frames = result["frames"]
    contexts = list(dict.fromkeys(f["ctx"] for f in frames))
    assert len(contexts) == len(TURNS), frames
    one_utterance = reference_bytes(server.target, "One.", TURNS_TOKENS)
    for k, (ctx, text) in enumerate(zip(contexts, TURNS, strict=True)):
        own = [f for f in frames if f["ctx"] == ctx]
        kinds = [f["t"] for f in own]
        assert kinds[0] == "TTSStartedFrame" and kinds[-1] == "TTSStoppedFrame", kinds
        assert kinds.count("TTSStoppedFrame") == 1, kinds
        # All of its audio and none of another turn's: one utterance per sentence.
        spoken = text.strip() != "---"
        assert sum(f["bytes"] for f in own if f["t"] == "audio") == spoken * one_utterance, k
        # Its words: as timed by the server, or the text no word timed, which Pipecat itself
        # hands on at the context's end ("---").
        assert [f["text"] for f in own if f["t"] == "word"] == text.split()
        # The turn ended once its mark had come back (the k-th mark the service sent).
        assert result["marks_at_stop"][k][k] == f"turn-{k + 1}", result["marks_at_stop"]
    # Frames of one turn never interleave with another's.
    order = [f["ctx"] for f in frames]
    assert order == sorted(order, key=contexts.index), order
    # Only Pipecat's own report of the turn that made no sound.
    assert len(result["errors"]) == 1 and "completed with no audio" in result["errors"][0]


def test_no_timer_decides_a_turn():
    """Turn ends come from marks: the settle window and the unspoken-text timeout are gone."""
    source = (REPO / "client" / "chattts_client" / "pipecat.py").read_text()
    for timer in ("asyncio.sleep", "call_later", "settle", "UNSPOKEN_TIMEOUT_S", "loop.time"):
        assert timer not in source, timer


_REFUSED = r"""
import asyncio, json, sys
from loguru import logger
logger.remove()
from pipecat.frames.frames import (ErrorFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame,
                                   LLMTextFrame, TTSAudioRawFrame)
from pipecat.tests.utils import SleepFrame, run_test
from chattts_client import ClientOptions, SynthesisOptions
from chattts_client.pipecat import ChatTTSTTSService

async def main():
    tts = ChatTTSTTSService(ClientOptions(sys.argv[1], token=sys.argv[2]),
                            SynthesisOptions(max_new_tokens=8))
    tokens = [LLMTextFrame(t) for t in ["One", " two", " three", " four", " five."]]
    down, up = await run_test(tts, frames_to_send=[
        LLMFullResponseStartFrame(), *tokens, LLMFullResponseEndFrame(), SleepFrame(sleep=1.0)])
    print(json.dumps({"errors": [f.error for f in up if isinstance(f, ErrorFrame)],
                      "audio": sum(isinstance(f, TTSAudioRawFrame) for f in down)}))

asyncio.run(main())
"""


def test_refused_token_is_one_clear_error_per_turn(tiny_model_dir, tmp_path):
    """A wrong token: the check at start and the turn's stream each report PERMISSION_DENIED
    once (not once per token, and not grpc.aio's INTERNAL in its place)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("agent-secret\n")
    base = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=2, warmup=False)
    config = replace(base, security=SecurityConfig(auth_token_file=tokens)).validate()
    python = client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])
    with InProcessServer(config) as srv:
        result = json.loads(run_in(python, _REFUSED, srv.target, "wrong").strip().splitlines()[-1])
        good = json.loads(
            run_in(python, _REFUSED, srv.target, "agent-secret").strip().splitlines()[-1]
        )
    ours = [e for e in result["errors"] if e.startswith("ChatTTS server")]
    assert len(ours) == 2 and all("PERMISSION_DENIED" in e for e in ours), result["errors"]
    # Besides ours, only Pipecat's own report of a turn that produced no audio.
    assert all("completed with no audio" in e for e in result["errors"] if e not in ours)
    assert result["audio"] == 0
    assert good["errors"] == [] and good["audio"] > 0, good
