"""Health honesty, reflection and the grpcurl path users take."""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chattts_server.engine.engine import ChatTTSEngine
from chattts_server.engine.runner import ModelRunner
from chattts_server.server import TTSServer
from serverutil import (
    DEV_MODEL_CACHE,
    InProcessServer,
    free_port,
    refuses_connections,
    tiny_server_config,
    wait_serving,
)
from streaming_calls import grpcurl_path


def _slow_loading(config, release: threading.Event) -> InProcessServer:
    """An in-process server whose model loads only once `release` is set (up to 60 s)."""

    def slow_runner():
        release.wait(60)
        return ModelRunner.load(config.model, config.engine)

    class Server(InProcessServer):
        def __enter__(self):
            self._thread.start()

            async def start():
                self.server = TTSServer(
                    config,
                    engine=ChatTTSEngine(config.model, config.engine, runner_factory=slow_runner),
                )
                return await self.server.start()

            self.port = self.call(start())
            return self

    return Server(config)


def test_health_is_not_serving_until_the_model_is_ready(tiny_model_dir):
    """--no-listen-when-ready: the port opens at start-up and health answers NOT_SERVING while
    the model loads (behind a readiness-checking proxy)."""
    release = threading.Event()
    base = tiny_server_config(DEV_MODEL_CACHE)
    config = replace(base, network=replace(base.network, listen_when_ready=False))

    with _slow_loading(config, release) as srv, grpc.insecure_channel(srv.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "chattts.v1.TextToSpeech"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        release.set()
        wait_serving(srv.target, timeout_s=60)
        reply = health.Check(
            health_pb2.HealthCheckRequest(service="chattts.v1.TextToSpeech"), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_grpcurl_lists_checks_and_synthesizes(server):
    grpcurl = grpcurl_path()

    def run(*args):
        return subprocess.run(
            [grpcurl, "-plaintext", *args], capture_output=True, text=True, timeout=120
        )  # noqa: E731

    listed = run(server.target, "list")
    assert listed.returncode == 0, listed.stderr
    services = listed.stdout.split()
    assert "chattts.v1.TextToSpeech" in services and "grpc.health.v1.Health" in services

    health = run(server.target, "grpc.health.v1.Health/Check")
    assert health.returncode == 0, health.stderr
    assert json.loads(health.stdout)["status"] == "SERVING"

    request = json.dumps(
        {
            "text": "Hello from grpcurl.",
            "config": {"sampling": {"minNewTokens": 40, "maxNewTokens": 40}},
        }
    )
    synth = run("-d", request, server.target, "chattts.v1.TextToSpeech/Synthesize")
    assert synth.returncode == 0, synth.stderr
    replies = [
        json.loads(block)
        for block in synth.stdout.replace("}\n{", "}\x00{").split("\x00")
        if block.strip()
    ]
    audio = [r["audio"] for r in replies if "audio" in r]
    ends = [r["utterance_end"] for r in replies if "utterance_end" in r]
    assert len(audio) >= 2 and len(ends) == 1
    assert ends[0]["num_tokens"] == 40


def test_reflection_can_be_turned_off(tiny_model_dir):
    from dataclasses import replace

    config = tiny_server_config(DEV_MODEL_CACHE)
    config = replace(config, security=replace(config.security, reflection=False))
    with InProcessServer(config) as srv:
        listed = subprocess.run(
            [grpcurl_path(), "-plaintext", srv.target, "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode != 0


def test_by_default_the_ports_refuse_connections_until_the_model_is_ready(tiny_model_dir):
    """Default flags (--listen-when-ready): while the model loads both ports are held (their
    numbers known) but refuse connections, so neither a TCP-checking proxy nor a client's round
    robin sends a call there; then SERVING."""
    release = threading.Event()
    base = tiny_server_config(DEV_MODEL_CACHE)
    assert base.network.listen_when_ready
    config = replace(base, network=replace(base.network, http_port=free_port()))

    with _slow_loading(config, release) as srv:
        http_port = srv.server.http_port
        assert srv.port and http_port
        assert refuses_connections(srv.port) and refuses_connections(http_port)
        release.set()
        wait_serving(srv.target, timeout_s=60)
        assert not refuses_connections(http_port)
