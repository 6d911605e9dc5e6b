"""Property-based fuzzing of request validation: a StreamSettings or an InvalidRequestError, never anything else."""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.api.convert import StreamSettings, Validator
from chattts_server.audio.encoding import SUPPORTED_ENCODINGS
from chattts_server.engine.types import InvalidRequestError, ModelInfo
from chattts_server.voices import VoiceLibrary

U32 = 2**32 - 1
U64 = 2**64 - 1

floats = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-45, 1.0, 5.0, 3.4e38, -3.4e38, math.inf, -math.inf, math.nan]),
)
u32 = st.one_of(st.integers(0, U32), st.sampled_from([0, 1, 2, 7, 9, 10, 626, 627, 768, 769, U32]))
u64 = st.one_of(st.integers(0, U64), st.sampled_from([0, U64]))
enum_ints = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, 8))
texts = st.text(max_size=64)


def _maybe(strategy):
    return st.one_of(st.none(), strategy)


@st.composite
def configs(draw) -> tts_pb2.SynthesisConfig:
    cfg = tts_pb2.SynthesisConfig()
    voice = draw(st.sampled_from(["none", "empty", "seed", "embedding", "preset"]))
    if voice == "empty":
        cfg.voice.SetInParent()
    elif voice == "seed":
        cfg.voice.seed = draw(u32)
    elif voice == "embedding":
        cfg.voice.speaker_embedding = draw(st.text(max_size=200))
    elif voice == "preset":
        cfg.voice.preset = draw(texts)
    if draw(st.booleans()):
        cfg.audio_format.encoding = draw(enum_ints)
        cfg.audio_format.sample_rate_hz = draw(
            st.one_of(u32, st.sampled_from([8000, 16000, 22050, 24000, 48000]))
        )
    for name in ("speed",):
        value = draw(_maybe(floats))
        if value is not None:
            setattr(cfg.prosody, name, value)
    cfg.prosody.refine_text = (
        False  # refine runs the text model; validation must not care either way
    )
    for name in ("oral", "laugh", "break_level"):
        value = draw(_maybe(u32))
        if value is not None:
            setattr(cfg.prosody, name, value)
    for name in ("temperature", "top_p", "repetition_penalty"):
        value = draw(_maybe(floats))
        if value is not None:
            setattr(cfg.sampling, name, value)
    for name in ("top_k", "max_new_tokens", "min_new_tokens"):
        value = draw(_maybe(u32))
        if value is not None:
            setattr(cfg.sampling, name, value)
    seed = draw(_maybe(u64))
    if seed is not None:
        cfg.sampling.seed = seed
    return cfg


VALIDATOR = Validator(
    VoiceLibrary(None),
    ModelInfo(
        sample_rate=24000,
        samples_per_token=512,
        speaker_dim=768,
        num_vq=4,
        num_audio_codes=626,
        max_new_tokens=384,
        max_tokens=512,
        device="cpu",
        dtype="float32",
    ),
    max_text_chars=4000,
    encodings=SUPPORTED_ENCODINGS,
)


@settings(max_examples=200, deadline=None)
@given(cfg=configs(), text=st.text(max_size=300))
def test_validation_returns_settings_or_field_error(cfg, text):
    try:
        result = VALIDATOR.settings(cfg)
    except InvalidRequestError as exc:
        assert exc.field_name.startswith("config.")
    else:
        assert isinstance(result, StreamSettings)
        s = result.sampling
        assert math.isfinite(s.temperature) and 0 < s.temperature <= 5
        assert 0 < s.top_p <= 1 and 1 <= s.top_k <= 626
        max_new = 384 if s.max_new_tokens is None else s.max_new_tokens
        assert 1 <= max_new <= 384 and 0 <= s.min_new_tokens <= max_new
        assert 0 <= result.speed <= 9
    try:
        assert VALIDATOR.text(text, "text") == text
    except InvalidRequestError as exc:
        assert exc.field_name == "text"


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cfg=configs())
def test_live_server_answers_ok_or_invalid_argument(stub, cfg):
    # Keep the live calls short: cap generation when the fuzzed config leaves it open.
    if not cfg.sampling.HasField("max_new_tokens") or cfg.sampling.max_new_tokens > 4:
        cfg.sampling.max_new_tokens = 4
    if cfg.sampling.HasField("min_new_tokens") and cfg.sampling.min_new_tokens > 4:
        cfg.sampling.min_new_tokens = 4
    try:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text="Fuzz.", config=cfg), timeout=30))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()


def test_live_server_is_healthy_after_fuzzing(stub):
    ok = tts_pb2.SynthesisConfig(sampling=tts_pb2.Sampling(min_new_tokens=2, max_new_tokens=2))
    replies = list(
        stub.Synthesize(tts_pb2.SynthesizeRequest(text="Still fine.", config=ok), timeout=30)
    )
    assert any(r.HasField("utterance_end") for r in replies)
