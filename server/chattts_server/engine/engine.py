"""The serving engine: one thread runs `EngineCore.step()`; asyncio handlers talk to it through
queues.

Each loop iteration takes commands (new requests, cancels, wake-ups), runs one core step and
hands each request's outputs to its `RequestHandle`. Everything about scheduling and the model
is in the core; this file is only the thread, the queues and the hand-off.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..config import EngineConfig
from ..config_model import ModelConfig
from ..errors import EngineError, EngineUnavailableError, InvalidRequestError
from ..model.errors import ModelLoadError
from ..thread_governor import ThreadGovernor, name_model_thread
from .bridge import RequestHandle
from .core import EngineCore, RequestOutput
from .events import AudioChunk, EngineEvent, Spoken, UtteranceDone
from .protocol import EngineStats, ModelInfo
from .utterance import UtteranceRequest

log = logging.getLogger(__name__)

_PAUSED_WAIT_S = 0.05
"""With every running request paused on its reader, wait this long for a wake-up."""


@dataclass(frozen=True)
class _Submit:
    handle: RequestHandle


@dataclass(frozen=True)
class _Cancel:
    handle: RequestHandle
    """Its reader went away before the last event."""


@dataclass(frozen=True)
class _Wake:
    """Look again: a paused reader caught up, or the engine is stopping."""


_Command = _Submit | _Cancel | _Wake


class ChatTTSEngine:
    """Implements the `Engine` protocol over an `EngineCore` on a dedicated thread."""

    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        runner_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.model_config = model_config
        self.config = engine_config
        self._runner_factory = runner_factory
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="chattts-engine", daemon=True)
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._healthy = True
        self.core: EngineCore | None = None
        self.thread_governor: ThreadGovernor | None = None
        """Adapts the CPU intra-op pool to contention (engine thread; None when off)."""
        self._model_info: ModelInfo | None = None
        self._handles: dict[str, RequestHandle] = {}
        """Requests the core holds, by id (engine thread only)."""
        self._stats = EngineStats(0, 0, engine_config.max_streams, 0)
        self._on_ready: Callable[[], None] = lambda: None
        self._on_fatal: Callable[[BaseException], None] = lambda exc: None

    # -- lifecycle -------------------------------------------------------------------------

    def start(
        self, on_ready: Callable[[], None], on_fatal: Callable[[BaseException], None]
    ) -> None:
        """Load and warm the model on the engine thread; callbacks run on that thread."""
        self._on_ready = on_ready
        self._on_fatal = on_fatal
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._commands.put(_Wake())
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._healthy

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def model_info(self) -> ModelInfo:
        assert self._model_info is not None, "model_info is published when the engine is ready"
        return self._model_info

    def stats(self) -> EngineStats:
        """The snapshot published after the engine's last step."""
        return self._stats

    # -- the asyncio side ------------------------------------------------------------------

    async def synthesize(self, request: UtteranceRequest) -> AsyncIterator[EngineEvent]:
        if not self.ready:
            raise EngineUnavailableError("engine is not ready")
        handle = RequestHandle(request, asyncio.get_running_loop(), self._wake)
        self._commands.put(_Submit(handle))
        try:
            while True:
                event = await handle.next_event()
                yield event
                if isinstance(event, UtteranceDone):
                    return
        finally:
            handle.closed = True
            if not handle.ended:
                self._commands.put(_Cancel(handle))

    def _wake(self) -> None:
        self._commands.put(_Wake())

    # -- the engine thread -----------------------------------------------------------------

    def _main(self) -> None:
        name_model_thread()  # before torch runs here: the OpenMP workers inherit the name
        try:
            started = time.monotonic()
            if self._runner_factory is not None:
                runner = self._runner_factory()
            else:
                from .runner import ModelRunner

                runner = ModelRunner.load(self.model_config, self.config)
            if self.config.warmup:
                runner.warmup(self.config.max_streams)
            self.core = EngineCore.from_config(runner, self.config, is_paused=self._is_paused)
            self._model_info = runner.info
            if self.model_config.adaptive_threads and self._model_info.device == "cpu":
                self.thread_governor = ThreadGovernor.for_torch(also=runner.set_gpt_threads)
            log.info("engine ready in %.1f s", time.monotonic() - started)
            self._ready.set()
            self._on_ready()
            self._loop(self.core)
        except BaseException as exc:  # noqa: BLE001 - anything here leaves the engine unusable
            if isinstance(exc, ModelLoadError):
                log.error("cannot load the model: %s", exc)  # a user error: no traceback
            else:
                log.exception("engine failed")
            self._healthy = False
            self._fail_all(EngineUnavailableError("engine failed"))
            self._on_fatal(exc)

    def _loop(self, core: EngineCore) -> None:
        while not self._stopping.is_set():
            self._take_commands(core, block=not core.has_unfinished_requests)
            if not core.has_unfinished_requests:
                continue
            self._pause_slow_readers()
            outputs = core.step()
            if self.thread_governor is not None:
                self.thread_governor.after_step(core.ran_model)
            self._stats = core.stats()
            for output in outputs:
                self._deliver(output)
            if not core.ran_model and core.has_unfinished_requests:
                # Everyone is paused on slow readers: wait for a wake-up, not a spin.
                self._take_commands(core, block=True, timeout_s=_PAUSED_WAIT_S)

    def _take_commands(self, core: EngineCore, block: bool, timeout_s: float = 0.5) -> None:
        try:
            first = self._commands.get(timeout=timeout_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        commands = [first]
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for command in commands:
            if isinstance(command, _Submit):
                self._submit(core, command.handle)
            elif isinstance(command, _Cancel):
                request_id = command.handle.request.request_id
                if self._handles.pop(request_id, None) is not None:
                    core.abort_request(request_id)
        self._stats = core.stats()

    def _submit(self, core: EngineCore, handle: RequestHandle) -> None:
        if handle.closed:
            return
        request = handle.request
        try:
            core.add_request(request)
        except InvalidRequestError as exc:
            handle.fail(exc)
            return
        except ValueError as exc:
            handle.fail(InvalidRequestError("text", str(exc)))
            return
        except Exception:
            log.exception("request %s failed while preparing its prompt", request.request_id)
            handle.fail(EngineError("could not prepare the prompt"))
            return
        self._handles[request.request_id] = handle

    def _pause_slow_readers(self) -> None:
        """Before a step: a request whose reader is `output_buffer_chunks` behind is paused (it
        keeps its slot and skips steps); its reader wakes the engine when it catches up."""
        for handle in self._handles.values():
            handle.paused = handle.outstanding >= self.config.output_buffer_chunks

    def _is_paused(self, request_id: str) -> bool:
        return self._handles[request_id].paused

    def _deliver(self, output: RequestOutput) -> None:
        handle = self._handles.get(output.request_id)
        if handle is None:
            return
        if output.spoken is not None:
            handle.emit(Spoken(output.spoken))
        for pcm in output.audio:
            handle.emit(AudioChunk(pcm))
        if output.error is not None:
            handle.fail(output.error)
        elif output.done is not None:
            handle.emit(output.done)
        if output.is_last:
            del self._handles[output.request_id]

    def _fail_all(self, error: BaseException) -> None:
        for handle in self._handles.values():
            handle.fail(error)
        self._handles.clear()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Submit):
                command.handle.fail(error)
