"""Two replicas behind client-side round_robin, on the client library's default service config
given to a plain generated stub (what the README tells other clients to copy): both serve, and
one drains away on SIGTERM while the client carries on against the survivor without a failed
call."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chattts_client.resilience import SERVICE_CONFIG
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from serverutil import ServerProcess, launch, wait_serving

pytestmark = pytest.mark.slow  # two subprocess servers: ~25 s to start on 2 cores

OK_LINE = "stream method=Synthesize status=OK"


@pytest.fixture
def replicas(tiny_model_dir: Path, dev_model_cache: Path) -> Iterator[list[ServerProcess]]:
    args = ["--max-streams", "2", "--grace-s", "15", "--no-reflection"]
    servers: list[ServerProcess] = []
    try:
        for _ in range(2):
            servers.append(launch(args, dev_model_cache, metrics=False))
        for srv in servers:
            wait_serving(srv.target, timeout_s=120)
        yield servers
    finally:
        for srv in servers:
            srv.stop(timeout_s=20)


def _config(num_tokens: int) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=num_tokens, max_new_tokens=num_tokens)
    )


def _speak(stub: tts_pb2_grpc.TextToSpeechStub, num_tokens: int = 6) -> int:
    replies = list(
        stub.Synthesize(
            tts_pb2.SynthesizeRequest(text="Hi.", config=_config(num_tokens)), timeout=30
        )
    )
    ends = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert len(ends) == 1 and ends[0].num_tokens == num_tokens
    return ends[0].num_tokens


def _wait_count(srv: ServerProcess, needle: str, at_least: int, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and srv.count(needle) < at_least:
        time.sleep(0.05)
    return srv.count(needle)


def test_round_robin_spreads_and_survives_a_drain(replicas: list[ServerProcess]) -> None:
    first, second = replicas
    target = f"ipv4:127.0.0.1:{first.port},127.0.0.1:{second.port}"
    options = [("grpc.service_config", json.dumps(SERVICE_CONFIG)), ("grpc.enable_retries", 1)]
    with grpc.insecure_channel(target, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for _ in range(8):
            _speak(stub)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and first.count(OK_LINE) + second.count(OK_LINE) < 8:
            time.sleep(0.05)
        assert first.count(OK_LINE) + second.count(OK_LINE) == 8
        assert first.count(OK_LINE) >= 2 and second.count(OK_LINE) >= 2, (
            first.count(OK_LINE),
            second.count(OK_LINE),
        )

        # A stream in flight on the replica that is told to stop finishes; then the replica exits.
        with grpc.insecure_channel(first.target) as direct:
            call = tts_pb2_grpc.TextToSpeechStub(direct).Synthesize(
                tts_pb2.SynthesizeRequest(text="Finish me.", config=_config(24)), timeout=30
            )
            first_reply = next(call)
            assert first_reply.HasField("audio")
            first.proc.terminate()  # SIGTERM: drain
            rest = list(call)
            assert rest[-1].HasField("utterance_end") and rest[-1].utterance_end.num_tokens == 24
        assert first.proc.wait(30) == 0
        assert "draining" in first.log_text()

        survivor_before = second.count(OK_LINE)
        first_total = first.count(OK_LINE)
        for _ in range(6):
            _speak(stub)
        assert _wait_count(second, OK_LINE, survivor_before + 6) == survivor_before + 6
        assert first.count(OK_LINE) == first_total
