"""Every wire encoding end to end: the real server, Synthesize, and decoding the chunks back."""

from __future__ import annotations

import io

import av
import grpc
import numpy as np
import pytest
import soundfile as sf

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

NUM_TOKENS = 16
NATIVE_RATE = 24000


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def synthesize(
    stub, encoding: int, rate: int
) -> tuple[list[tts_pb2.AudioChunk], list[tts_pb2.UtteranceEnd]]:
    config = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1234),
        audio_format=tts_pb2.AudioFormat(encoding=encoding, sample_rate_hz=rate),
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=NUM_TOKENS, max_new_tokens=NUM_TOKENS),
    )
    chunks, ends = [], []
    for reply in stub.Synthesize(
        tts_pb2.SynthesizeRequest(text="Formats, one by one.", config=config), timeout=60
    ):
        if reply.HasField("audio"):
            chunks.append(reply.audio)
        else:
            ends.append(reply.utterance_end)
    return chunks, ends


def decode(encoding: int, data: bytes, rate: int) -> np.ndarray:
    if encoding == tts_pb2.LINEAR16:
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if encoding == tts_pb2.FLOAT32:
        return np.frombuffer(data, dtype="<f4")
    if encoding in (tts_pb2.MULAW, tts_pb2.ALAW):
        subtype = "ULAW" if encoding == tts_pb2.MULAW else "ALAW"
        audio, _ = sf.read(
            io.BytesIO(data),
            format="RAW",
            subtype=subtype,
            samplerate=rate,
            channels=1,
            dtype="float32",
        )
        return audio
    assert encoding == tts_pb2.OGG_OPUS
    frames = []
    with av.open(io.BytesIO(data), format="ogg") as container:
        for frame in container.decode(audio=0):
            assert frame.sample_rate == rate
            frames.append(frame.to_ndarray().reshape(-1))
    return np.concatenate(frames)


CASES = [
    (tts_pb2.LINEAR16, 24000),
    (tts_pb2.MULAW, 8000),
    (tts_pb2.ALAW, 8000),
    (tts_pb2.FLOAT32, 44100),
    (tts_pb2.OGG_OPUS, 48000),
    (tts_pb2.LINEAR16, 16000),
]


@pytest.mark.parametrize(
    "encoding, rate", CASES, ids=[f"{tts_pb2.AudioEncoding.Name(e)}@{r}" for e, r in CASES]
)
def test_encoding_round_trip(stub, encoding: int, rate: int) -> None:
    chunks, ends = synthesize(stub, encoding, rate)
    assert chunks and len(ends) == 1 and ends[0].num_tokens == NUM_TOKENS
    assert all(c.sample_rate_hz == rate and c.encoding == encoding for c in chunks)

    offset = 0
    for c in chunks:
        assert c.sample_offset == offset
        offset += c.num_samples
    total = offset
    # One token is 2 mel frames of 256 samples at 24 kHz; the centred iSTFT gives (2n - 1) hops.
    expected = NUM_TOKENS * 512 * rate / NATIVE_RATE
    assert abs(total - expected) <= 512 * rate / NATIVE_RATE + 2, (total, expected)

    audio = decode(encoding, b"".join(c.audio for c in chunks), rate)
    assert audio.ndim == 1 and np.isfinite(audio).all() and np.abs(audio).max() > 0
    if encoding == tts_pb2.OGG_OPUS:
        assert abs(len(audio) - total) <= 960, (len(audio), total)  # within one 20 ms frame
    else:
        assert len(audio) == total
        if encoding != tts_pb2.FLOAT32:
            # Each chunk decodes on its own: sample encodings never split a sample across chunks.
            assert sum(len(decode(encoding, c.audio, rate)) for c in chunks) == total


def test_g711_decodes_to_the_same_signal_as_linear16(stub) -> None:
    """Same seed, same rate: mu-law and A-law carry the LINEAR16 signal up to companding error."""
    ref_chunks, _ = synthesize(stub, tts_pb2.LINEAR16, 8000)
    ref = decode(tts_pb2.LINEAR16, b"".join(c.audio for c in ref_chunks), 8000)
    for encoding in (tts_pb2.MULAW, tts_pb2.ALAW):
        chunks, _ = synthesize(stub, encoding, 8000)
        audio = decode(encoding, b"".join(c.audio for c in chunks), 8000)
        assert len(audio) == len(ref)
        err = np.sqrt(np.mean((audio - ref) ** 2)) / max(np.sqrt(np.mean(ref**2)), 1e-6)
        assert err < 0.1, (tts_pb2.AudioEncoding.Name(encoding), err)
