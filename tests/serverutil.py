"""Run the real server for tests: in-process (on its own thread and event loop) or as a subprocess."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chattts_server.config import (
    AdmissionConfig,
    EngineConfig,
    ModelConfig,
    NetworkConfig,
    ServerConfig,
)
from chattts_server.server import TTSServer

REPO = Path(__file__).resolve().parents[1]


def tiny_server_config(
    cache: Path, max_streams: int = 4, max_queue: int = 4, **engine: object
) -> ServerConfig:
    return ServerConfig(
        model=ModelConfig(dev_model="tiny", dev_model_cache=cache, device="cpu", dtype="float32"),
        engine=replace(
            EngineConfig(max_streams=max_streams, max_tokens=512, max_new_tokens=384), **engine
        ),
        admission=AdmissionConfig(max_queue=max_queue, grace_s=5.0),
        network=NetworkConfig(host="127.0.0.1", port=0),
    ).validate()


def wait_serving(
    target: str, timeout_s: float = 120.0, credentials: grpc.ChannelCredentials | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    channel = (
        grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{target} did not report SERVING within {timeout_s} s")


class InProcessServer:
    """The real TTSServer on a background thread with its own event loop."""

    def __init__(self, config: ServerConfig, wait: bool = True) -> None:
        self.config = config
        self.wait = wait
        self.server: TTSServer | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="test-server", daemon=True
        )
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, coro, timeout_s: float = 60.0):  # run a coroutine on the server's loop
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def __enter__(self) -> InProcessServer:
        self._thread.start()

        async def start() -> int:
            self.server = TTSServer(self.config)
            return await self.server.start()

        self.port = self.call(start())
        if self.wait:
            wait_serving(self.target)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.call(self.server.drain(grace_s=1.0), timeout_s=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    """A `chattts-server` subprocess whose output (log lines included) is kept in `log`."""

    proc: subprocess.Popen[str]
    port: int
    metrics_port: int
    log: list[str] = field(default_factory=list)
    voices: Path | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return "".join(self.log)

    def count(self, needle: str) -> int:
        return sum(needle in line for line in list(self.log))

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        """Whatever the test did, leave no server behind."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def launch(args: list[str], cache: Path, metrics: bool = True) -> ServerProcess:
    """Start `chattts-server` (tiny dev model) on a free loopback port and, if `metrics`, a free
    metrics port; returns once it listens. Its output is kept in `.log` (and echoed to stderr)."""
    metrics_port = free_port() if metrics else 0
    cmd = [sys.executable, "-m", "chattts_server.main", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--dev-model", "tiny", "--dev-model-cache", str(cache), "--device", "cpu"]
    cmd += ["--metrics-port", str(metrics_port), *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO / 'server'}"},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on port (\d+)", line)
        if m:
            srv = ServerProcess(proc, int(m.group(1)), metrics_port, lines)
            threading.Thread(target=_tee, args=(proc, lines), daemon=True).start()
            return srv
    proc.kill()
    proc.wait(10)
    raise RuntimeError("server did not start:\n" + "".join(lines))


def _tee(proc: subprocess.Popen[str], sink: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sink.append(line)
        sys.stderr.write("[server] " + line)
