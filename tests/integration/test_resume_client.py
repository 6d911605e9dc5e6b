"""The client library resumes by itself (`AsyncTTSClient.open_stream`, resumable by default):
a real TCP relay cuts the connection at random points, several times a call, also while a mark,
a segment's end and a replace are in flight; the caller sees a `ResumedEvent` per cut and
otherwise exactly the events and PCM of an uncut stream with the same seed."""

from __future__ import annotations

import asyncio
import random

import pytest

from chattts_client import (
    AsyncTTSClient,
    AudioChunkEvent,
    ResumedEvent,
    SegmentEndEvent,
    UtteranceEndEvent,
    make_config,
)
from chattts_devtools.tcp_relay import TcpRelay

CALL_TIMEOUT_S = 300


def _config():  # type: ignore[no-untyped-def]
    config = make_config(voice="seed:7", seed=11, word_timing=True)
    config.sampling.max_new_tokens = 50
    config.sampling.min_new_tokens = 30
    return config


def _comparable(event: object) -> object:
    """An event less the server's own timings (they differ from run to run)."""
    if isinstance(event, UtteranceEndEvent):
        from dataclasses import replace

        return replace(event, time_to_first_audio_s=0, generation_time_s=0, lag_s=0)
    return event


async def _drive(target: str, cut: TcpRelay | None, seed: int) -> tuple[bytes, list, int]:  # type: ignore[type-arg]
    """A navigation-like script on one PushStream; with `cut`, the relay is cut after a random
    number of responses, again and again. The PCM, the other events, the resumes."""
    rng = random.Random(seed)
    pcm = bytearray()
    events: list[object] = []
    resumes = 0
    async with AsyncTTSClient(target) as client:
        stream = client.open_stream(config=_config(), timeout=CALL_TIMEOUT_S)
        stream.segment("turn", "In three hundred meters, turn left.")
        stream.mark("after-turn")
        stream.push("Then keep right at the fork, ")
        stream.flush("and follow the signs.")
        countdown = rng.randint(1, 4)
        replaced = False
        async with stream:
            async for event in stream:
                if isinstance(event, ResumedEvent):
                    resumes += 1
                    continue
                if isinstance(event, AudioChunkEvent):
                    pcm += event.audio
                else:
                    events.append(_comparable(event))
                if not replaced and isinstance(event, SegmentEndEvent):
                    replaced = True
                    stream.replace("turn", "Now turn left.", if_started="cut")
                    stream.mark("end")
                    stream.end_input()
                countdown -= 1
                if cut is not None and countdown == 0:
                    cut.cut()
                    countdown = rng.randint(1, 4)
    return bytes(pcm), events, resumes


@pytest.mark.parametrize("seed", [1, 2])
def test_the_client_library_resumes_every_cut_and_loses_or_repeats_nothing(
    resume_server, seed
) -> None:  # type: ignore[no-untyped-def]
    want_pcm, want_events, _ = asyncio.run(_drive(resume_server.target, None, seed))
    with TcpRelay(resume_server.port) as relay:
        pcm, events, resumes = asyncio.run(_drive(relay.target, relay, seed))
        cuts = relay.cuts
    # A cut while a resume connects is ridden out by the same resume.
    assert 3 <= resumes <= cuts, "the script was cut too few times to show anything"
    assert pcm == want_pcm
    assert events == want_events
