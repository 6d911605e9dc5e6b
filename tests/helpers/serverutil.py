"""Run the real server for tests: in-process (on its own thread and event loop) or as a subprocess
(through `chattts_server.launcher`, shared with the benchmarks)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from chattts_devtools import launcher
from chattts_devtools.launcher import ServerProcess, free_port, wait_serving
from chattts_server.config import (
    AdmissionConfig,
    EngineConfig,
    ModelConfig,
    NetworkConfig,
    ServerConfig,
)
from chattts_server.engine.engine import ChatTTSEngine
from chattts_server.engine.step_io import ModelOutput, PreparedPrompt, SchedulerOutput
from chattts_server.engine.utterance import UtteranceRequest
from chattts_server.errors import EngineError
from chattts_server.server import TTSServer

__all__ = [
    "DEV_MODEL_CACHE",
    "REPO",
    "FaultyRunner",
    "InProcessServer",
    "ServerProcess",
    "free_port",
    "launch",
    "bad_request_field",
    "tiny_server_config",
    "wait_serving",
]

REPO = Path(__file__).resolve().parents[2]
DEV_MODEL_CACHE = REPO / ".cache" / "dev-models"
"""Where the tests build the dev models once (git-ignored)."""


def tiny_server_config(
    cache: Path, max_streams: int = 4, max_queue: int = 4, **engine: object
) -> ServerConfig:
    return ServerConfig(
        # The server's own GPT path (llama.cpp in the format the quality budget picks), with a
        # fixed thread count: the governor drops threads on a loaded machine, and tests compare
        # a stream's audio with the same request's again (tests/integration/test_threads.py
        # tests the governor).
        model=ModelConfig(
            dev_model="tiny", dev_model_cache=cache, device="cpu", adaptive_threads=False
        ),
        engine=replace(
            EngineConfig(max_streams=max_streams, max_tokens=512, max_new_tokens=384), **engine
        ),
        admission=AdmissionConfig(max_queue=max_queue, grace_s=5.0),
        network=NetworkConfig(host="127.0.0.1", port=0),
    ).validate()


class InProcessServer:
    """The real TTSServer on a background thread with its own event loop. `runner_factory`
    builds the engine's model runner (e.g. a `FaultyRunner` around the real one)."""

    def __init__(
        self,
        config: ServerConfig,
        wait: bool = True,
        runner_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.config = config
        self.wait = wait
        self.runner_factory = runner_factory
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
            engine = None
            if self.runner_factory is not None:
                c = self.config
                engine = ChatTTSEngine(c.model, c.engine, runner_factory=self.runner_factory)
            self.server = TTSServer(self.config, engine=engine)
            return await self.server.start()

        self.port = self.call(start())
        if self.wait:
            server = self.server
            wait_serving(self.target, failure=lambda: server.fatal if server else None)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.call(self.server.drain(grace_s=1.0), timeout_s=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def launch(args: list[str], cache: Path, metrics: bool = True) -> ServerProcess:
    """Start `chattts-server` (tiny dev model, CPU) on a free loopback port and, if `metrics`, a
    free metrics port; returns once it listens. Its output is kept in `.log` and echoed to stderr.
    """
    return launcher.launch(
        args, dev_model="tiny", cache=cache, metrics=metrics, echo=True, cwd=REPO
    )


class FaultyRunner:
    """The real `ModelRunner` with faults a test switches on, outside the production code.

    `fail_text`: a request whose text holds it fails alone in the step it is computed in (the
    runner reports its slot in `ModelOutput.failed`, as for a non-finite hidden state).
    `broken`: every step raises, as on a lost device."""

    def __init__(self, config: ServerConfig) -> None:
        from chattts_server.engine.runner import ModelRunner

        self.inner = ModelRunner.load(config.model, config.engine)
        self.fail_text: str | None = None
        self.broken = False
        self._texts: dict[str, str] = {}
        self._slot_texts: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def prepare(self, request_id: str, params: UtteranceRequest) -> PreparedPrompt:
        self._texts[request_id] = params.text
        return self.inner.prepare(request_id, params)

    def execute(self, plan: SchedulerOutput) -> ModelOutput:
        if self.broken:
            raise RuntimeError("device lost")
        for new in plan.new_slots:
            self._slot_texts[new.slot_id] = self._texts.pop(new.request_id, "")
        output = self.inner.execute(plan)
        for slot_id in plan.slot_ids:
            if self.fail_text and self.fail_text in self._slot_texts.get(slot_id, ""):
                output.failed[slot_id] = EngineError(f"injected {self.fail_text} failure")
                output.audio.pop(slot_id, None)
        return output


def bad_request_field(err: grpc.RpcError) -> str:
    """The field an INVALID_ARGUMENT names in its google.rpc.BadRequest details."""
    status = rpc_status.from_call(err)
    assert status is not None, "INVALID_ARGUMENT must carry google.rpc.Status details"
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return bad.field_violations[0].field


def refuses_connections(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on `port`: a TCP connection to it is refused (or times out)."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return True
    return False
