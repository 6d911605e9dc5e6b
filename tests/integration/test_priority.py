"""Priority classes through the real server (in-process, tiny model, a loopback port) and the
generated gRPC stubs: bulk streams hold the unreserved places and queue for more; a navigation
prompt (PRIORITY_INTERACTIVE) takes the reserved place at once, a second one is admitted ahead
of the bulk streams that queued before it, and both show their class in the stream log line
and the metrics. Bad priorities are refused naming the field, on gRPC and HTTP."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from polling import wait_until
from serverutil import DEV_MODEL_CACHE, InProcessServer, bad_request_field, tiny_server_config

WAIT_S = 60.0
TOKENS = 8


def _config(priority: int) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        priority=priority,
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=TOKENS, max_new_tokens=TOKENS),
    )


class HeldStream:
    """A StreamingSynthesize call that sends its config and then holds its place (sending no
    text) until `end()`; its replies are read on a thread."""

    def __init__(self, stub: tts_pb2_grpc.TextToSpeechStub, priority: int) -> None:
        self._release = threading.Event()
        self.call = stub.StreamingSynthesize(self._requests(priority), timeout=WAIT_S)
        self.error: grpc.RpcError | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self, priority: int) -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=_config(priority))
        self._release.wait(WAIT_S)

    def _read(self) -> None:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError as exc:
            self.error = exc

    def end(self) -> None:
        self._release.set()
        self._reader.join(WAIT_S)


@pytest.fixture
def srv(tiny_model_dir):
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=3, max_queue=8)
    config = replace(config, admission=replace(config.admission, reserved_slots=1)).validate()
    with InProcessServer(config) as srv:
        yield srv


def _speak(stub: tts_pb2_grpc.TextToSpeechStub, text: str) -> int:
    """One navigation prompt (Synthesize, PRIORITY_INTERACTIVE); returns its audio bytes."""
    request = tts_pb2.SynthesizeRequest(text=text, config=_config(tts_pb2.PRIORITY_INTERACTIVE))
    return sum(len(r.audio.audio) for r in stub.Synthesize(request, timeout=WAIT_S))


def _metric(srv: InProcessServer, name: str, **labels: str) -> float:
    value = srv.server.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_an_interactive_stream_takes_the_reserved_place_and_goes_ahead_of_queued_bulk(
    srv: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    admission = srv.server.admission
    held: list[HeldStream] = []
    with grpc.insecure_channel(srv.target) as channel, caplog.at_level(logging.INFO):
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        try:
            for _ in range(4):
                held.append(HeldStream(stub, tts_pb2.PRIORITY_BULK))
            # Two of the three places are open to bulk streams; the third is reserved.
            wait_until(lambda: admission.active == 2 and admission.waiting == 2, WAIT_S, "2+2")
            assert _speak(stub, "Turn left in 200 metres.") > 0  # the reserved place, at once
            assert admission.waiting == 2
            # Now fill the reserved place too: a second prompt queues behind both bulk
            # streams, and is admitted first when a place frees.
            first = HeldStream(stub, tts_pb2.PRIORITY_INTERACTIVE)
            wait_until(lambda: admission.active == 3, WAIT_S, "the reserved place taken")
            second = HeldStream(stub, tts_pb2.PRIORITY_INTERACTIVE)
            wait_until(lambda: admission.waiting == 3, WAIT_S, "the second prompt queued")
            held[0].end()  # a bulk place frees: the interactive waiter takes it, not a bulk one
            wait_until(lambda: admission.waiting == 2, WAIT_S, "one admitted")
            assert admission.waiting_by_priority()[0] == 0  # no interactive stream left waiting
            first.end()
            second.end()
        finally:
            for stream in held:
                stream.end()
    assert all(s.error is None for s in held), [s.error for s in held]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stream ")]
    assert sum("method=Synthesize status=OK" in m and "priority=interactive" in m for m in lines)
    assert sum("priority=bulk" in m for m in lines) == 4
    assert (
        _metric(srv, "chattts_streams_by_priority_total", priority="interactive", status="OK") == 3
    )
    ttfa = "chattts_time_to_first_audio_by_priority_seconds_count"
    assert _metric(srv, ttfa, priority="interactive") >= 1


def test_a_bad_priority_is_refused_naming_the_field(server: InProcessServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(text="Hi.", config=tts_pb2.SynthesisConfig())
        request.config.priority = 42  # an enum value this server does not know
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Synthesize(request, timeout=WAIT_S))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(info.value) == "config.priority"
