"""Run the real server for tests: in-process (on its own thread and event loop) or as a subprocess
(through `chattts_server.launcher`, shared with the benchmarks)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

from chattts_server import launcher
from chattts_server.config import (
    AdmissionConfig,
    EngineConfig,
    ModelConfig,
    NetworkConfig,
    ServerConfig,
)
from chattts_server.launcher import ServerProcess, free_port, wait_serving
from chattts_server.server import TTSServer

__all__ = [
    "REPO",
    "InProcessServer",
    "ServerProcess",
    "free_port",
    "launch",
    "tiny_server_config",
    "wait_serving",
]

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


def launch(args: list[str], cache: Path, metrics: bool = True) -> ServerProcess:
    """Start `chattts-server` (tiny dev model, CPU) on a free loopback port and, if `metrics`, a
    free metrics port; returns once it listens. Its output is kept in `.log` and echoed to stderr."""
    return launcher.launch(
        args, dev_model="tiny", cache=cache, metrics=metrics, echo=True, cwd=REPO
    )
