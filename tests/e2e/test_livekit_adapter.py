"""The LiveKit Agents adapter (chattts_client.livekit) driven as the framework drives a TTS, with
livekit-agents itself (dev install), against the real server (tiny dev model, loopback): two
segments on one TTS object, a stream closed mid-utterance (the server logs CANCELLED for it),
synthesize(), an unreachable server, and an `AgentSession(use_tts_aligned_transcript=True)`
whose agent's transcription node receives our TimedStrings; the stream's own `segment` and
`replace` (a prompt revised with no interruption), and lexicons passed on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc  # noqa: E402
from livekit.agents import (  # noqa: E402
    DEFAULT_API_CONNECT_OPTIONS,
    Agent,
    AgentSession,
    APIConnectionError,
    APIConnectOptions,
    APIStatusError,
    ModelSettings,
)
from livekit.agents.metrics import TTSMetrics  # noqa: E402
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, TimedString  # noqa: E402
from livekit.agents.voice import io  # noqa: E402

from chattts_client import (  # noqa: E402
    AudioChunkEvent,
    ClientOptions,
    SynthesisOptions,
    TTSClient,
)
from chattts_client.livekit import TTS  # noqa: E402
from chattts_server.config import SecurityConfig
from httputil import streams_total  # noqa: E402
from serverutil import (  # noqa: E402
    DEV_MODEL_CACHE,  # noqa: E402
    REPO,
    InProcessServer,
    free_port,
    tiny_server_config,
)

pytestmark = pytest.mark.slow

NUM_TOKENS = 60  # every utterance: min_new_tokens == max_new_tokens, so its length is known
OPTIONS = SynthesisOptions(voice=7, seed=5, max_new_tokens=NUM_TOKENS, min_new_tokens=NUM_TOKENS)


def _synthesize_samples(target: str, text: str) -> int:
    """What our plain client receives for `text` through Synthesize."""
    config = OPTIONS.to_config()
    with TTSClient(target) as client:
        return sum(
            e.num_samples
            for e in client.synthesize(text, config=config, timeout=60)
            if isinstance(e, AudioChunkEvent)
        )


async def _speak(
    tts: TTS, fragments: list[str], timed: list[TimedString] | None = None
) -> tuple[int, list[str]]:
    """One segment as an agent speaks an LLM reply: fragments, flush, end_input; the samples
    and segment ids of the audio frames (and, into `timed`, the words the frames carry)."""
    stream = tts.stream()
    for fragment in fragments:
        stream.push_text(fragment)
        await asyncio.sleep(0.01)  # tokens arrive over time
    stream.flush()
    stream.end_input()
    num_samples, segments = 0, []
    async with stream:
        async for audio in stream:
            assert audio.frame.sample_rate == 24000 and audio.frame.num_channels == 1
            num_samples += audio.frame.samples_per_channel
            segments.append(audio.segment_id)
            if timed is not None:
                timed += audio.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
    return num_samples, segments


def test_two_segments_on_one_tts_then_synthesize(server):
    one = _synthesize_samples(server.target, "One.")
    six_seven = _synthesize_samples(server.target, "Six. Seven.")
    metrics: list[TTSMetrics] = []
    timed: list[TimedString] = []
    timed_synthesized: list[TimedString] = []

    async def run() -> tuple[int, int, int]:
        tts = TTS(server.target, OPTIONS)
        assert tts.capabilities.aligned_transcript
        tts.on("metrics_collected", metrics.append)
        # Each segment is two sentences, so two utterances of NUM_TOKENS each.
        first, ids_1 = await _speak(tts, ["One.", " Two", " words."])
        second, ids_2 = await _speak(tts, ["Three.", " Four", " five."], timed)
        assert len(set(ids_1)) == 1 and len(set(ids_2)) == 1 and ids_1[0] != ids_2[0]
        num_samples = 0
        async for audio in tts.synthesize("Six. Seven."):
            num_samples += audio.frame.samples_per_channel
            timed_synthesized.extend(audio.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []))
        await tts.aclose()
        return first, second, num_samples

    first, second, synthesized = asyncio.run(run())
    # Frames carry every sample the server sent, nothing more (the emitter re-frames them).
    assert first == second == 2 * one
    assert synthesized == six_seven
    # Each segment's words in the caller's text, timed from the segment's own start.
    assert timed == ["Three. ", "Four ", "five."]
    assert timed[0].start_time == 0 and timed[-1].end_time <= second / 24000
    assert timed_synthesized == ["Six. ", "Seven."] and timed_synthesized[0].start_time == 0
    streamed = [m for m in metrics if m.streamed]
    assert len(streamed) == 2 and all(0 < m.ttfb < m.duration for m in streamed), metrics
    assert any(not m.streamed and m.ttfb > 0 for m in metrics), metrics


def test_stream_closed_mid_utterance_is_cancelled_on_the_server(server, caplog):
    """Closing the stream (the agent interrupted) cancels the call itself: the server logs
    CANCELLED while the TTS object, and so the channel, stays open."""
    caplog.set_level(logging.INFO)

    def cancelled() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if "method=StreamingSynthesize" in r.getMessage()
            and "status=CANCELLED" in r.getMessage()
        ]

    async def run() -> int:
        tts = TTS(server.target, replace(OPTIONS, max_new_tokens=300, min_new_tokens=300))
        stream = tts.stream()
        stream.push_text("A long sentence that would take a while to speak. And another one.")
        stream.flush()
        num_frames = 0
        async for _audio in stream:
            num_frames += 1
            if num_frames == 2:
                break  # the agent was interrupted
        await stream.aclose()
        # Generous: on a loaded machine the cancel is slow to land, not wrong.
        deadline = time.monotonic() + 60
        while not cancelled() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await tts.aclose()
        return num_frames

    assert asyncio.run(run()) == 2
    streams = [
        r.getMessage() for r in caplog.records if "method=StreamingSynthesize" in r.getMessage()
    ]
    assert len(cancelled()) == 1, streams
    (line,) = cancelled()
    tokens = int(line.split("tokens=")[1].split()[0])
    assert tokens < 2 * 300, line  # generation stopped: two utterances of 300 were asked for


def test_prompt_revised_on_the_stream(server):
    """The adapter's own `segment` and `replace` on one stream (LiveKit has no such calls): a
    navigation prompt speaking, revised with "cut" once its audio flows. Every sample up to
    the cut, then exactly the revision's; each revision's end in `segment_ends`, and its words
    in the caller's text."""
    prompt = " ".join(f"In {n}00 m turn left." for n in range(9, 5, -1))  # four sentences
    update = "In 100 m turn left."
    one = _synthesize_samples(server.target, update)
    timed: list[TimedString] = []

    async def run() -> tuple[int, list[tuple[str, int, str, int]]]:
        tts = TTS(server.target, OPTIONS)
        stream = tts.stream()
        stream.segment("nav", prompt)
        num_samples, revised = 0, False
        async with stream:
            async for audio in stream:
                num_samples += audio.frame.samples_per_channel
                timed.extend(audio.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []))
                if num_samples >= 4000 and not revised:  # past the server's first chunk
                    stream.replace("nav", update, if_started="cut")
                    stream.end_input()
                    revised = True
        ends = [(e.name, e.revision, e.outcome, e.sample_offset) for e in stream.segment_ends]
        await tts.aclose()
        return num_samples, ends

    num_samples, ends = asyncio.run(run())
    (_, _, first_outcome, cut), second = ends
    assert first_outcome == "cut" and second == ("nav", 1, "spoken", num_samples), ends
    assert num_samples == cut + one and 0 < cut < 2 * one, (num_samples, cut, one)
    assert "".join(timed).endswith(update), timed


def test_lexicons_go_with_every_call(server):
    """`SynthesisOptions.lexicons` reach the server with every call: a lexicon name it does
    not know fails both the stream and Synthesize with a final 400 naming the field. (grpc.aio
    may report a stream's refusal that crosses a write as INTERNAL; `AsyncTTSClient.explain`
    replays the stream's config to recover the server's status.)"""

    async def run() -> list[APIStatusError]:
        tts = TTS(server.target, replace(OPTIONS, lexicons=("no-such-lexicon",)))
        no_retry = APIConnectOptions(max_retry=0)
        stream = tts.stream(conn_options=no_retry)
        stream.push_text("Hello.")
        stream.end_input()
        with pytest.raises(APIStatusError) as stream_refused:
            async for _ in stream:
                pass
        with pytest.raises(APIStatusError) as refused:
            await tts.synthesize("Hello.", conn_options=no_retry).collect()
        await tts.aclose()
        return [stream_refused.value, refused.value]

    for error in asyncio.run(run()):
        assert error.status_code == 400 and "lexicons" in str(error), error


def test_unreachable_server_is_an_api_connection_error():
    async def run() -> None:
        tts = TTS(f"127.0.0.1:{free_port()}")
        no_retry = APIConnectOptions(max_retry=0, timeout=2.0)
        stream = tts.stream(conn_options=no_retry)
        stream.push_text("Hello.")
        stream.end_input()
        with pytest.raises(APIConnectionError, match="unreachable"):
            async for _ in stream:
                pass
        with pytest.raises(APIConnectionError, match="unreachable"):
            await tts.synthesize("Hello.", conn_options=no_retry).collect()
        await tts.aclose()

    asyncio.run(run())


def test_refusals_are_the_api_errors_the_framework_retries_right(tiny_model_dir, tmp_path):
    """On a token-protected server with room for one stream: the token option reaches the auth
    check; a missing or wrong token is a final 401/403 APIStatusError (not retried: no retry
    interval passes); a full server is a retryable 429. (grpc.aio reports such refusals as
    INTERNAL when they cross a write; the adapter recovers the server's status.)"""
    tokens = tmp_path / "tokens"
    tokens.write_text("agent-secret\n")
    base = tiny_server_config(DEV_MODEL_CACHE, max_streams=1, max_queue=0, warmup=False)
    config = replace(base, security=SecurityConfig(auth_token_file=tokens)).validate()
    no_retry = APIConnectOptions(max_retry=0)

    async def speak(tts: TTS, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> int:
        stream = tts.stream(conn_options=conn_options)
        stream.push_text("Hello.")
        stream.end_input()
        async with stream:
            return sum([a.frame.samples_per_channel async for a in stream])

    async def run(srv: InProcessServer) -> None:
        good = TTS(ClientOptions(srv.target, token="agent-secret"), OPTIONS)
        assert await speak(good) > 0
        for token, status, name in (
            (None, 401, "UNAUTHENTICATED"),
            ("wrong", 403, "PERMISSION_DENIED"),
        ):
            before = streams_total(srv, "StreamingSynthesize", name)
            with pytest.raises(APIStatusError) as refused:
                bad = TTS(ClientOptions(srv.target, token=token), OPTIONS)
                await speak(bad)  # default retries: a final error skips them
            assert refused.value.status_code == status and not refused.value.retryable
            # Not retried: the server refused this one attempt, no second after 2 s.
            assert streams_total(srv, "StreamingSynthesize", name) == before + 1
        # The one stream held open: the next is refused as full, 429, which the framework
        # retries (after its interval) and a FallbackAdapter moves on from.
        busy = good.stream()
        busy.push_text("Busy.")
        await busy.__anext__()
        for _ in range(3):
            with pytest.raises(APIStatusError) as full:
                await speak(good, no_retry)
            assert full.value.status_code == 429 and full.value.retryable, full.value
        await busy.aclose()
        await good.aclose()

    with InProcessServer(config) as srv:
        asyncio.run(run(srv))


def test_readme_example_runs(server, tmp_path):
    out = tmp_path / "livekit.wav"
    script = REPO / "examples" / "livekit_say.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--target",
            server.target,
            "--max-new-tokens",
            "24",
            "--out",
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "client")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.startswith(f"wrote {out}")
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() > 0


class _InstantAudioOutput(io.AudioOutput):
    """An agent's audio sink that plays each segment at once (no room): the framework's
    playback events, which its transcript synchronizer waits for, come at each flush."""

    def __init__(self) -> None:
        super().__init__(label="instant", capabilities=io.AudioOutputCapabilities(pause=False))
        self.num_samples = 0
        self._segment_samples = 0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self._segment_samples == 0:
            self.on_playback_started(created_at=time.time())
        self._segment_samples += frame.samples_per_channel
        self.num_samples += frame.samples_per_channel

    def flush(self) -> None:
        super().flush()
        played_s, self._segment_samples = self._segment_samples / 24000, 0
        self.on_playback_finished(playback_position=played_s, interrupted=False)

    def clear_buffer(self) -> None:
        pass


class _TranscriptRecorder(Agent):
    """Keeps what the framework hands the agent's transcription node."""

    def __init__(self) -> None:
        super().__init__(instructions="Read the text aloud.")
        self.chunks: list[str] = []

    async def transcription_node(  # type: ignore[override]
        self, text: AsyncIterator[str], model_settings: ModelSettings
    ) -> AsyncIterator[str]:
        async for chunk in text:
            self.chunks.append(chunk)
            yield chunk


def test_agent_session_with_aligned_transcript_receives_timed_strings(server):
    """With use_tts_aligned_transcript=True the framework takes the agent's transcript from the
    TTS (it does so only for a TTS whose capabilities say aligned_transcript): each word of the
    reply as a TimedString of the caller's own text, in order, within the reply's audio."""
    said = "Walk 200 m, then stop. Second sentence."

    async def run() -> tuple[list[str], int]:
        session = AgentSession(tts=TTS(server.target, OPTIONS), use_tts_aligned_transcript=True)
        sink = _InstantAudioOutput()
        session.output.audio = sink
        agent = _TranscriptRecorder()
        await session.start(agent)
        await session.say(said)
        await session.aclose()
        return agent.chunks, sink.num_samples

    chunks, num_samples = asyncio.run(run())
    assert all(isinstance(c, TimedString) for c in chunks), chunks
    assert "".join(chunks) == said  # "200 m" as written, not as spoken
    assert chunks == ["Walk ", "200 m, ", "then ", "stop. ", "Second ", "sentence."]
    starts = [c.start_time for c in chunks]  # type: ignore[attr-defined]
    ends = [c.end_time for c in chunks]  # type: ignore[attr-defined]
    assert starts == sorted(starts) and all(s < e for s, e in zip(starts, ends, strict=True))
    assert starts[0] == 0 and 0 < ends[-1] <= num_samples / 24000
