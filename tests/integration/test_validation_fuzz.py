"""Property-based fuzzing of request validation: a StreamSettings or an InvalidRequestError, never anything else."""

from __future__ import annotations

import json
import math

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.api.convert import Validator
from chattts_server.api.voices import VoiceLibrary
from chattts_server.audio.containers import CONTAINER_ENCODINGS
from chattts_server.audio.encoding import SUPPORTED_ENCODINGS
from chattts_server.errors import InvalidRequestError
from chattts_server.stream.settings import StreamSettings
from model_info import TINY_MODEL_INFO

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
    TINY_MODEL_INFO,
    max_text_chars=4000,
    encodings=SUPPORTED_ENCODINGS + CONTAINER_ENCODINGS,
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


# -- the HTTP doors' JSON: any value in, settings or an InvalidRequestError out --------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),  # lone surrogates included
    st.sampled_from(["alloy", "seed:7", "pcm", "mp3", "wav", "LINEAR16", "MULAW", "PLAIN", "NaN"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=12,
)
CONFIG_FIELDS = {
    "voice": st.one_of(json_values, st.sampled_from(["alloy", "nobody", {"id": "nova"}])),
    "audio_format": st.one_of(json_values, st.just({"encoding": "MULAW", "sample_rate_hz": 8000})),
    "prosody": st.one_of(json_values, st.just({"speed": 3, "oral": 11})),
    "sampling": st.one_of(json_values, st.just({"top_p": 2}), st.just({"seed": -1})),
    "text_release": json_values,
    "text_format": json_values,
    "no_such_field": json_values,
}
config_objects = st.fixed_dictionaries({}, optional=CONFIG_FIELDS)
speech_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"input": st.one_of(st.just("Hello there."), json_values)},
        optional={
            "voice": CONFIG_FIELDS["voice"],
            "speed": json_values,
            "response_format": st.one_of(json_values, st.sampled_from(["pcm", "opus", "flac"])),
            "stream_format": json_values,
            "instructions": json_values,
            "model": json_values,
            "chattts": st.one_of(config_objects, json_values),
        },
    ),
)


def _named(exc: InvalidRequestError) -> None:
    assert exc.field_name and exc.description


@settings(max_examples=300, deadline=None)
@given(body=speech_bodies)
def test_speech_bodies_give_settings_or_a_field_error(body):
    from chattts_server.api.client_json import parse_json
    from chattts_server.api.http.speech import parse_speech_request

    try:
        # Through the text the door reads: JSON's own escapes, lone surrogates included.
        value = parse_json(json.dumps(body), "body")
        job = parse_speech_request(value, VALIDATOR, VoiceLibrary(None))
    except InvalidRequestError as exc:
        _named(exc)
    else:
        assert isinstance(job.settings, StreamSettings)
        assert job.settings.audio.encoding in VALIDATOR.encodings


@settings(max_examples=300, deadline=None)
@given(config=config_objects)
@example(config={"text_format": math.inf})  # int(inf) in protobuf's parser: OverflowError
@example(config={"priority": -math.inf, "max_lag_s": math.nan})
def test_websocket_configs_give_settings_or_a_field_error(config):
    from chattts_server.api.client_json import check_json
    from chattts_server.api.http.ws_messages import ws_settings

    message = {"type": "config", **config}
    try:
        check_json(json.loads(json.dumps(message)), "message", "config.")
        settings_ = ws_settings(message, VALIDATOR, VoiceLibrary(None))
    except InvalidRequestError as exc:
        _named(exc)
        assert exc.field_name.startswith(("config", "message")), exc.field_name
    else:
        assert isinstance(settings_, StreamSettings)


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
