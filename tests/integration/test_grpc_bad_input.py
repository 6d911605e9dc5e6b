"""Bad input at the gRPC door (docs RELIABILITY.md): each refused with the status and field it
deserves, on the shared server, which is still healthy afterwards. The HTTP doors:
test_http_hostile.py."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chattts_proto.chattts.v1 import tts_pb2
from reliability_calls import assert_healthy, fixed, request, rpc_error
from serverutil import bad_request_field

SYNTH = "/chattts.v1.TextToSpeech/Synthesize"


def test_oversized_message_is_resource_exhausted(server):
    err = rpc_error(server.target, tts_pb2.SynthesizeRequest(text="a" * (2 << 20), config=fixed(4)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_healthy(server.target)


def test_text_over_the_limit_is_invalid_argument(server):
    err = rpc_error(server.target, tts_pb2.SynthesizeRequest(text="word " * 1000, config=fixed(4)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text" in err.details()
    assert_healthy(server.target)


def test_unknown_encoding_enum_is_invalid_argument(server):
    req = request()
    req.config.audio_format.encoding = 99
    err = rpc_error(server.target, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.audio_format.encoding" in err.details()
    assert_healthy(server.target)


def _with(**config: object) -> tts_pb2.SynthesizeRequest:
    req = request()
    for path, value in config.items():
        message = req.config
        *parents, leaf = path.split("__")
        for name in parents:
            message = getattr(message, name)
        setattr(message, leaf, value)
    return req


@pytest.mark.parametrize(
    "req, field",
    [
        (tts_pb2.SynthesizeRequest(text=" \n\t ", config=fixed(4)), "text"),
        (_with(audio_format__sample_rate_hz=12345), "config.audio_format.sample_rate_hz"),
        (_with(sampling__top_p=float("inf")), "config.sampling.top_p"),
        (_with(sampling__temperature=float("nan")), "config.sampling.temperature"),
        (_with(text_format=99), "config.text_format"),
        (_with(prosody__speed=-1.0), "config.prosody.speed"),
    ],
    ids=["whitespace-text", "bad-rate", "inf", "nan", "unknown-enum", "out-of-range"],
)
def test_bad_values_are_invalid_argument_naming_the_field(server, req, field):
    """RELIABILITY.md's bad-input rows at the gRPC door (the HTTP doors: test_http_hostile)."""
    err = rpc_error(server.target, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err) == field


def test_invalid_utf8_in_a_string_field(server):
    raw = b"\x0a\x02\xff\xfe"  # field 1 (text), length-delimited, two bytes that are not UTF-8
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_stream(
            SYNTH, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as info:
            list(call(raw, timeout=10))
    # Left to grpcio, a failed deserialization answers UNKNOWN with the exception's text; the
    # server parses requests itself and answers INVALID_ARGUMENT.
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in (info.value.details() or "")
    assert "Traceback" not in (info.value.details() or "")
    assert_healthy(server.target)


def test_invalid_utf8_in_a_streaming_message(server):
    config = tts_pb2.StreamingSynthesizeRequest(config=fixed(4)).SerializeToString()
    bad_text = (
        b"\x12\x04\x0a\x02\xff\xfe"  # field 2 (text) -> TextInput field 1 (text) = invalid UTF-8
    )
    with grpc.insecure_channel(server.target) as channel:
        call = channel.stream_stream(
            "/chattts.v1.TextToSpeech/StreamingSynthesize",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for messages in ([bad_text], [config, bad_text]):
            with pytest.raises(grpc.RpcError) as info:
                list(call(iter(messages), timeout=10))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_healthy(server.target)


def test_health_check_on_unknown_service_is_not_found(server):
    with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="no.Such"), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert_healthy(server.target)
