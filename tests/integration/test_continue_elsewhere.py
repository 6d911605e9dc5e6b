"""A stream whose server is gone goes on as a new stream on another, from the first word the
listener has not wholly heard (`AsyncTTSClient.open_stream`, chattts_client/continuation.py).

Two real servers; a real TCP relay in front of the first is cut mid-audio and sends the next
connection to the second, as a proxy does when a replica is killed: the resume is answered
NOT_FOUND there, and the client library starts the text not yet heard on it. The caller sees
one `ResumedEvent(new_stream=True)` and no error; its events go on on one timeline (audio
contiguous, utterances counted on, marks and word timings in its own text), and the word
timings show no word spoken twice and none left out."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chattts_client import (
    AsyncTTSClient,
    AudioChunkEvent,
    MarkEvent,
    ResumedEvent,
    UtteranceEndEvent,
    make_config,
)
from chattts_client.resuming import DROPPED
from chattts_devtools.tcp_relay import TcpRelay
from chattts_proto.chattts.v1 import tts_pb2
from heard_words import assert_each_word_heard_once
from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config

CALL_TIMEOUT_S = 300
TEXT = [
    "Turn left onto the high street. ",
    "Keep going past the old station and the river bridge. ",
    "Then take the second exit at the roundabout. ",
]


@pytest.fixture(scope="module")
def replicas(tiny_model_dir: Path) -> Iterator[tuple[InProcessServer, InProcessServer]]:
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=2)
    with InProcessServer(config) as first, InProcessServer(config) as second:
        yield first, second


def _config():  # type: ignore[no-untyped-def]
    config = make_config(voice="seed:7", seed=11, word_timing=True)
    config.sampling.max_new_tokens = 60
    config.sampling.min_new_tokens = 40
    return config


async def _lose_the_server(relay: TcpRelay, second_port: int, cut_at_chunk: int) -> list[object]:
    """The script: the text, a mark after the second sentence, the third; the first server is
    lost at the `cut_at_chunk`-th audio chunk."""
    events: list[object] = []
    chunks = 0
    async with AsyncTTSClient(relay.target) as client:
        stream = client.open_stream(config=_config(), timeout=CALL_TIMEOUT_S)
        stream.push(TEXT[0])
        stream.mark("bridge", TEXT[1])
        stream.push(TEXT[2])
        stream.end_input()
        async with stream:
            async for event in stream:
                events.append(event)
                if isinstance(event, AudioChunkEvent):
                    chunks += 1
                    if chunks == cut_at_chunk:
                        relay.retarget(second_port)
                        relay.cut()
    return events


@pytest.mark.parametrize("cut_at_chunk", [3, 7])
def test_a_lost_server_s_stream_goes_on_elsewhere_with_no_word_twice_or_missing(
    replicas: tuple[InProcessServer, InProcessServer], cut_at_chunk: int
) -> None:
    first, second = replicas
    with TcpRelay(first.port) as relay:
        events = asyncio.run(_lose_the_server(relay, second.port, cut_at_chunk))

    resumed = [e for e in events if isinstance(e, ResumedEvent)]
    assert len(resumed) == 1 and resumed[0].new_stream, resumed
    went_on = resumed[0]
    assert went_on.gap_s < CALL_TIMEOUT_S and went_on.attempts >= 1
    text = "".join(TEXT)
    assert went_on.from_word == len(text[: went_on.from_source].split())

    # One timeline: the audio contiguous across the two streams, utterances counted on.
    audio = [e for e in events if isinstance(e, AudioChunkEvent)]
    at = 0
    for chunk in audio:
        assert chunk.sample_offset == at, (chunk, at)
        at += chunk.num_samples
    assert went_on.sample_offset == sum(c.num_samples for c in audio[:cut_at_chunk])
    ends = [e for e in events if isinstance(e, UtteranceEndEvent)]
    indices = [e.utterance_index for e in ends]
    assert indices == sorted(set(indices)), indices
    assert [e.name for e in events if isinstance(e, MarkEvent)] == ["bridge"]

    assert_each_word_heard_once(text, events)


def test_a_lost_ssml_stream_fails_with_the_original_status(
    replicas: tuple[InProcessServer, InProcessServer],
) -> None:
    """An SSML document cut at a word is no document: no new stream, the loss is the caller's."""
    first, second = replicas

    async def run() -> None:
        config = _config()
        config.text_format = tts_pb2.SSML
        async with AsyncTTSClient(relay.target) as client:
            stream = client.open_stream(config=config, timeout=CALL_TIMEOUT_S)
            stream.push("<speak>" + "".join(TEXT) + "</speak>")
            stream.end_input()
            async with stream:
                async for event in stream:
                    assert not isinstance(event, ResumedEvent)
                    if isinstance(event, AudioChunkEvent):
                        relay.retarget(second.port)
                        relay.cut()

    with TcpRelay(first.port) as relay, pytest.raises(grpc.aio.AioRpcError) as failure:
        asyncio.run(run())
    assert failure.value.code() in DROPPED  # the cut, as it came
