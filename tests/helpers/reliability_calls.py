"""The gRPC calls the reliability tests make (tests/integration/test_reliability.py,
test_grpc_bad_input.py): fixed-length requests, a follow-up health check, a Synthesize that must
fail, and one run on a thread of its own."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc


def fixed(num_tokens: int, seed: int = 7) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1234),
        sampling=tts_pb2.Sampling(seed=seed, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
    )


def request(text: str = "Hello there.", tokens: int = 6) -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(text=text, config=fixed(tokens))


def assert_healthy(target: str) -> None:
    """A follow-up small Synthesize succeeds and health says SERVING."""
    with grpc.insecure_channel(target) as channel:
        replies = list(tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(request(), timeout=60))
        assert any(r.HasField("utterance_end") for r in replies)
        status = (
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(), timeout=5)
            .status
        )
        assert status == health_pb2.HealthCheckResponse.SERVING


LONG_WAIT_S = 300
"""The deadline of a call whose deadline is not under test, and how long a test waits for it: only
a broken call reaches it, however loaded the machine."""


class Streamer(threading.Thread):
    """Runs one Synthesize on its own thread; records the first-chunk event and the final code."""

    def __init__(
        self,
        target: str,
        req: tts_pb2.SynthesizeRequest,
        timeout: float = LONG_WAIT_S,
        gate: threading.Event | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.target, self.req, self.timeout = target, req, timeout
        self.gate = gate
        """If given, the reader stops after its first reply until the gate opens (it holds its place)."""
        self.first = threading.Event()
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.replies = 0

    def run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            try:
                for _ in tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
                    self.req, timeout=self.timeout
                ):
                    self.replies += 1
                    self.first.set()
                    if self.gate is not None:
                        self.gate.wait(LONG_WAIT_S)
                self.code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                self.code, self.details = exc.code(), exc.details() or ""
            finally:
                self.first.set()

    def result(self, timeout_s: float = LONG_WAIT_S) -> grpc.StatusCode | None:
        self.join(timeout_s)
        assert not self.is_alive(), "stream did not finish"
        return self.code


def rpc_error(target: str, req: tts_pb2.SynthesizeRequest) -> grpc.RpcError:
    """The error a Synthesize of `req` ends with (it must fail)."""
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as info:
        list(tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(req, timeout=30))
    return info.value
