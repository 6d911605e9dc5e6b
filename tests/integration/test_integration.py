"""End to end: the real server on a loopback port, the generated stubs, the tiny ChatTTS model."""

from __future__ import annotations

import io
import math
import threading
import time

import grpc
import numpy as np
import pytest
import soundfile as sf

from chattts_client.wav import WavWriter
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from polling import wait_until
from serverutil import bad_request_field


def samples_for(num_tokens: int) -> int:
    """Offline length: one GPT token -> 2 mel frames; Vocos's centred iSTFT gives (frames - 1) hops."""
    return (2 * num_tokens - 1) * 256


def fixed_length(num_tokens: int, seed: int = 7) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1234),
        sampling=tts_pb2.Sampling(seed=seed, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
    )


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def test_synthesize_streams_chunks_before_generation_ends(stub):
    chunks, ends = [], []
    for reply in stub.Synthesize(
        tts_pb2.SynthesizeRequest(text="Hello world.", config=fixed_length(120)), timeout=120
    ):
        if reply.HasField("audio"):
            chunks.append(reply.audio)
        else:
            ends.append(reply.utterance_end)
    assert len(chunks) >= 3
    (end,) = ends
    assert end.num_tokens == 120 and end.finish_reason == "max_tokens"
    # The first chunk left before the last token was generated: audio streams while the rest
    # is generated (an order of events, which no load can reverse, not a ratio of times).
    assert end.time_to_first_audio_s < end.generation_time_s
    offsets = [c.sample_offset for c in chunks]
    assert offsets[0] == 0
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt.sample_offset == prev.sample_offset + prev.num_samples
    total = sum(c.num_samples for c in chunks)
    assert total == samples_for(120)
    assert all(c.sample_rate_hz == 24000 and c.encoding == tts_pb2.LINEAR16 for c in chunks)
    assert math.isclose(end.audio_duration_s, total / 24000)

    wav = io.BytesIO()
    with WavWriter(wav, 24000) as writer:
        for c in chunks:
            writer.write(c.audio)
    wav.seek(0)
    audio, rate = sf.read(wav, dtype="float32")
    assert rate == 24000 and audio.ndim == 1 and len(audio) == total
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_streaming_synthesize_speaks_sentences_as_text_arrives(stub):
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=fixed_length(40))
        for fragment in ["First sen", "tence. Second", " one", "."]:
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=fragment))
        yield tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text=" tail without end", flush=True)
        )

    replies = list(stub.StreamingSynthesize(requests(), timeout=120))
    ends = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    chunks = [r.audio for r in replies if r.HasField("audio")]
    assert [e.utterance_index for e in ends] == [0, 1, 2]
    assert [e.text for e in ends][0].lower().startswith("first")
    offset = 0
    for c in chunks:
        assert c.sample_offset == offset
        offset += c.num_samples
    assert offset == 3 * samples_for(40)
    # Every chunk of utterance i precedes the end of utterance i.
    order = [
        (r.audio.utterance_index, 0)
        if r.HasField("audio")
        else (r.utterance_end.utterance_index, 1)
        for r in replies
    ]
    assert order == sorted(order)


def test_same_seed_same_audio(stub):
    def audio(seed: int) -> bytes:
        req = tts_pb2.SynthesizeRequest(text="Repeat after me.", config=fixed_length(30, seed=seed))
        return b"".join(
            r.audio.audio for r in stub.Synthesize(req, timeout=60) if r.HasField("audio")
        )

    first, again, other = audio(5), audio(5), audio(6)
    assert first == again
    assert first != other


def test_list_voices(stub):
    reply = stub.ListVoices(tts_pb2.ListVoicesRequest(), timeout=10)
    assert isinstance(list(reply.voices), list)


@pytest.mark.parametrize(
    "requests, field",
    [
        ([tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text="hi."))], "config"),
        (
            [
                tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig()),
                tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig()),
            ],
            "config",
        ),
        (
            [
                tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig()),
                # Whitespace-only text is valid in a stream (LLM tokens); a NUL is not.
                tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text="a\x00b")),
            ],
            "text.text",
        ),
        (
            [
                tts_pb2.StreamingSynthesizeRequest(
                    config=tts_pb2.SynthesisConfig(voice=tts_pb2.Voice(preset="nobody"))
                )
            ],
            "config.voice.preset",
        ),
        (
            [
                tts_pb2.StreamingSynthesizeRequest(
                    config=tts_pb2.SynthesisConfig(prosody=tts_pb2.Prosody(speed=float("nan")))
                )
            ],
            "config.prosody.speed",
        ),
    ],
    ids=["text-before-config", "second-config", "nul-in-text", "unknown-voice", "nan-speed"],
)
def test_bad_streaming_input_is_invalid_argument_naming_the_field(stub, requests, field):
    with pytest.raises(grpc.RpcError) as info:
        list(stub.StreamingSynthesize(iter(requests), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(info.value) == field


def test_bad_unary_input(stub):
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text=""), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        list(
            stub.Synthesize(
                tts_pb2.SynthesizeRequest(
                    text="x", config=tts_pb2.SynthesisConfig(sampling=tts_pb2.Sampling(top_p=0))
                ),
                timeout=10,
            )
        )
    assert bad_request_field(info.value) == "config.sampling.top_p"


def test_cancel_mid_stream_frees_the_slot(server, stub):
    engine = server.server.engine
    call = stub.Synthesize(
        tts_pb2.SynthesizeRequest(text="A long sentence to cancel.", config=fixed_length(300)),
        timeout=60,
    )
    first = next(call)
    assert first.HasField("audio")
    call.cancel()
    wait_until(lambda: engine.stats().active_requests == 0, 10, "the cancelled slot to free")
    tokens_after_cancel = engine.stats().tokens_generated
    time.sleep(0.3)  # a window in which nothing may happen, not a wait for an event
    assert engine.stats().tokens_generated == tokens_after_cancel


def test_slow_reader_does_not_stall_other_streams(server, stub):
    slow = stub.Synthesize(
        tts_pb2.SynthesizeRequest(text="Slow reader.", config=fixed_length(300)), timeout=60
    )
    next(slow)  # then stop reading: its buffer fills and its generation pauses
    done = threading.Event()

    def fast():
        list(
            stub.Synthesize(
                tts_pb2.SynthesizeRequest(text="Fast reader.", config=fixed_length(60)), timeout=60
            )
        )
        done.set()

    t = threading.Thread(target=fast)
    t.start()
    t.join(60)
    assert done.is_set()
    slow.cancel()
