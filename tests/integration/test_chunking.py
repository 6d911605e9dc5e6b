"""A caller sets its own chunk schedule (`SynthesisConfig.chunking`) through the generated gRPC
client: a short first chunk for a navigation prompt, and INVALID_ARGUMENT naming the field for a
schedule the server cannot follow. The server under test runs the default flags (4, 32, 8, and a
first lookahead of 4)."""

from __future__ import annotations

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from serverutil import bad_request_field

NUM_TOKENS = 40
SAMPLES_PER_TOKEN = 512


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def _chunks(stub, chunking: tts_pb2.Chunking | None) -> list[tts_pb2.AudioChunk]:
    config = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1234),
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=NUM_TOKENS, max_new_tokens=NUM_TOKENS),
        chunking=chunking,
    )
    replies = list(
        stub.Synthesize(tts_pb2.SynthesizeRequest(text="Turn left.", config=config), timeout=120)
    )
    (end,) = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert end.num_tokens == NUM_TOKENS
    return [r.audio for r in replies if r.HasField("audio")]


def test_a_request_sets_a_short_first_chunk(stub):
    default = _chunks(stub, None)
    short = _chunks(stub, tts_pb2.Chunking(first_chunk_tokens=2, max_chunk_tokens=4))
    # The server's first chunk holds its 4 tokens; the request's holds at most its 2.
    assert 2 * SAMPLES_PER_TOKEN < default[0].num_samples <= 4 * SAMPLES_PER_TOKEN
    assert 0 < short[0].num_samples <= 2 * SAMPLES_PER_TOKEN
    # Chunks of at most 4 tokens after it (the last flushes the lookahead's tail): many more
    # of them than the server's 4, 8, 16, ..., and the same audio length in all.
    assert len(short) > 2 * len(default)
    assert max(c.num_samples for c in short[1:-1]) <= 4 * SAMPLES_PER_TOKEN
    assert sum(c.num_samples for c in short) == sum(c.num_samples for c in default)


@pytest.mark.parametrize(
    "chunking, field",
    [
        (tts_pb2.Chunking(first_chunk_tokens=0), "first_chunk_tokens"),
        (tts_pb2.Chunking(max_chunk_tokens=2000), "max_chunk_tokens"),
        (tts_pb2.Chunking(lookahead_tokens=129), "lookahead_tokens"),
        # Longer than the server's cap of 32, and a cap below the server's first chunk of 4.
        (tts_pb2.Chunking(first_chunk_tokens=40), "first_chunk_tokens"),
        (tts_pb2.Chunking(max_chunk_tokens=2), "max_chunk_tokens"),
        (tts_pb2.Chunking(first_chunk_tokens=16, max_chunk_tokens=8), "first_chunk_tokens"),
    ],
)
def test_a_schedule_the_server_cannot_follow_is_invalid_argument(stub, chunking, field):
    config = tts_pb2.SynthesisConfig(chunking=chunking)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text="x", config=config), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(info.value) == f"config.chunking.{field}"
