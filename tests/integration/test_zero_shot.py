"""Zero-shot voice: a reference clip and its transcript in the config (ChatTTS's sample-audio path)."""

from __future__ import annotations

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from clips import clip
from serverutil import bad_request_field


def config(reference: bytes, transcript: str = "a short reference sentence", tokens: int = 20):
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(
            reference=tts_pb2.ReferenceVoice(audio=reference, transcript=transcript)
        ),
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=tokens, max_new_tokens=tokens),
    )


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def test_reference_voice_speaks_and_is_carried_across_sentences(stub):
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=config(clip()))
        yield tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text="Same words. Same words.")
        )

    replies = list(stub.StreamingSynthesize(requests(), timeout=120))
    audio = {0: b"", 1: b""}
    for r in replies:
        if r.HasField("audio"):
            audio[r.audio.utterance_index] += r.audio.audio
    ends = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert [e.num_tokens for e in ends] == [20, 20]
    # The same clip, text and seed give the same audio in both sentences of the stream.
    assert audio[0] and audio[0] == audio[1]


def test_reference_voice_changes_the_audio(stub):
    def speak(cfg: tts_pb2.SynthesisConfig) -> bytes:
        req = tts_pb2.SynthesizeRequest(text="Hello there.", config=cfg)
        return b"".join(
            r.audio.audio for r in stub.Synthesize(req, timeout=60) if r.HasField("audio")
        )

    plain = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=20, max_new_tokens=20)
    )
    assert speak(config(clip())) != speak(plain)


@pytest.mark.parametrize(
    "reference, transcript, field",
    [
        (b"not audio at all", "words", "config.voice.reference.audio"),
        (b"", "words", "config.voice.reference.audio"),
        (clip(seconds=0.2), "words", "config.voice.reference.audio"),
        (clip(seconds=12.0, rate=8000), "words", "config.voice.reference.audio"),
        (clip(), "", "config.voice.reference.transcript"),
    ],
    ids=["garbage", "empty", "too-short", "too-long", "no-transcript"],
)
def test_bad_reference_is_invalid_argument(stub, reference, transcript, field):
    req = tts_pb2.SynthesizeRequest(text="Hello.", config=config(reference, transcript))
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Synthesize(req, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(info.value) == field
