"""The serving engine: one thread owns the model; asyncio handlers talk to it through queues.

Each loop iteration: take commands (new requests, cancels, wake-ups), ask the scheduler for a
plan (admissions into free slots, prefill chunks, the decode batch), let the runner execute it,
and hand the resulting audio to each request's `RequestHandle`.
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

from ..config import EngineConfig, ModelConfig
from .bridge import RequestHandle
from .scheduler import Scheduler, Sequence
from .types import (
    AudioChunk,
    EngineError,
    EngineEvent,
    EngineStats,
    EngineUnavailableError,
    InvalidRequestError,
    UtteranceDone,
    UtteranceRequest,
)

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_STEP_FAILURES = 3


@dataclass
class _Work:
    """Engine-side state of a request, carried as the scheduler sequence's payload."""

    handle: RequestHandle
    submitted_at: float
    first_audio_at: float | None = None
    num_samples: int = 0


class ChatTTSEngine:
    """Implements the `Engine` protocol over a `ModelRunner` on a dedicated thread."""

    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        runner_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.model_config = model_config
        self.config = engine_config
        self._runner_factory = runner_factory
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="chattts-engine", daemon=True)
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._healthy = True
        self.runner: Any = None
        self.scheduler = Scheduler(
            engine_config.max_streams, engine_config.max_tokens, engine_config.prefill_chunk_tokens
        )
        self.sample_rate = 24000
        self.speaker_dim = 0
        self.tokens_generated = 0
        self._on_ready: Callable[[], None] = lambda: None
        self._on_fatal: Callable[[BaseException], None] = lambda exc: None
        self._step_failures = 0
        self.fault_hook: Callable[[UtteranceRequest], None] | None = None
        """Test seam: called on the engine thread for each step of each request; may raise."""

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
        self._commands.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._healthy

    @property
    def healthy(self) -> bool:
        return self._healthy

    def stats(self) -> EngineStats:
        return EngineStats(
            active_requests=len(self.scheduler.running),
            waiting_requests=len(self.scheduler.waiting),
            num_slots=self.scheduler.num_slots,
            tokens_generated=self.tokens_generated,
        )

    # -- the asyncio side ------------------------------------------------------------------

    async def synthesize(self, request: UtteranceRequest) -> AsyncIterator[EngineEvent]:
        if not self.ready:
            raise EngineUnavailableError("engine is not ready")
        handle = RequestHandle(request, asyncio.get_running_loop(), self._wake)
        self._commands.put(("submit", handle))
        try:
            while True:
                event = await handle.next_event()
                yield event
                if isinstance(event, UtteranceDone):
                    return
        finally:
            handle.closed = True
            if not handle.finished:
                self._commands.put(("cancel", handle))

    def _wake(self) -> None:
        self._commands.put(("wake", None))

    # -- the engine thread -----------------------------------------------------------------

    def _main(self) -> None:
        try:
            from .runner import ModelRunner

            started = time.monotonic()
            factory = self._runner_factory or (
                lambda: ModelRunner.load(self.model_config, self.config)
            )
            self.runner = factory()
            self.sample_rate = self.runner.sample_rate
            self.speaker_dim = self.runner.speaker_dim
            if self.config.warmup:
                self.runner.warmup(self.scheduler.num_slots)
            log.info("engine ready in %.1f s", time.monotonic() - started)
            self._ready.set()
            self._on_ready()
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - anything here leaves the engine unusable
            if type(exc).__name__ == "ModelLoadError":
                log.error("cannot load the model: %s", exc)  # a user error: no traceback
            else:
                log.exception("engine failed")
            self._healthy = False
            self._fail_all(EngineUnavailableError("engine failed"))
            self._on_fatal(exc)

    def _loop(self) -> None:
        handles: dict[RequestHandle, Sequence] = {}
        while not self._stopping.is_set():
            idle = not self.scheduler.running and not self.scheduler.waiting
            self._take_commands(handles, block=idle)
            # Expire before scheduling, so no plan ever holds a sequence the runner has dropped.
            self._expire_deadlines(handles)
            plan = self.scheduler.schedule(is_paused=self._is_paused)
            for seq in plan.aborted:
                self.runner.release(seq)
                handles.pop(seq.payload.handle, None)
            if not (plan.prefill or plan.decode):
                if self.scheduler.running:
                    # Everyone is paused on slow readers: wait for a wake-up, not a spin.
                    self._take_commands(handles, block=True, timeout_s=0.05)
                continue
            self._run_step(plan, handles)

    def _take_commands(
        self, handles: dict[RequestHandle, Sequence], block: bool, timeout_s: float = 0.5
    ) -> None:
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
        for kind, handle in commands:
            if kind == "submit":
                self._submit(handle, handles)
            elif kind == "cancel" and handle in handles:
                self.scheduler.cancel(handles[handle])

    def _submit(self, handle: RequestHandle, handles: dict[RequestHandle, Sequence]) -> None:
        if handle.closed:
            return
        request = handle.request
        seq = Sequence(
            request_id=request.request_id,
            prompt_len=0,
            max_new_tokens=request.sampling.max_new_tokens,
            payload=_Work(handle, time.monotonic()),
        )
        try:
            seq.prompt_len = self.runner.open(seq, request)
            self.scheduler.add(seq)
        except InvalidRequestError as exc:
            self.runner.release(seq)
            handle.fail(exc)
            return
        except ValueError as exc:
            self.runner.release(seq)
            handle.fail(InvalidRequestError("text", str(exc)))
            return
        except Exception as exc:
            log.exception("request %s failed while preparing its prompt", request.request_id)
            self.runner.release(seq)
            handle.fail(EngineError("could not prepare the prompt"))
            del exc
            return
        handles[handle] = seq

    def _is_paused(self, seq: Sequence) -> bool:
        handle = seq.payload.handle
        paused = handle.outstanding >= self.config.output_buffer_chunks
        handle.paused = paused
        return paused

    def _expire_deadlines(self, handles: dict[RequestHandle, Sequence]) -> None:
        now = time.monotonic()
        for handle, seq in list(handles.items()):
            deadline = handle.request.deadline
            if deadline is not None and now > deadline:
                self._finish(seq, handles, error=TimeoutError("deadline exceeded"))

    def _run_step(self, plan: Any, handles: dict[RequestHandle, Sequence]) -> None:
        try:
            if self.fault_hook is not None:
                for seq in [c.seq for c in plan.prefill] + plan.decode:
                    try:
                        self.fault_hook(seq.payload.handle.request)
                    except Exception as exc:
                        log.error("request %s failed: %s", seq.request_id, exc, exc_info=True)
                        self._finish(seq, handles, error=EngineError(str(exc)[:200]))
                plan.prefill = [c for c in plan.prefill if c.seq.slot_id is not None]
                plan.decode = [s for s in plan.decode if s.slot_id is not None]
            outputs = self.runner.step(plan)
            self._step_failures = 0
        except Exception:
            self._step_failures += 1
            log.exception("engine step failed (%d in a row)", self._step_failures)
            for seq in [c.seq for c in plan.prefill] + plan.decode:
                if seq.slot_id is not None:
                    self._finish(
                        seq, handles, error=EngineError("internal error during generation")
                    )
            if self._step_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise
            return
        now = time.monotonic()
        for out in outputs:
            seq = out.seq
            work: _Work = seq.payload
            self.tokens_generated += out.num_new_tokens
            for pcm in out.audio:
                if work.first_audio_at is None:
                    work.first_audio_at = now
                work.num_samples += len(pcm)
                work.handle.emit(AudioChunk(pcm))
            if out.error is not None:
                self._finish(seq, handles, error=out.error)
                continue
            if out.restart is not None:
                prompt_len, max_new = out.restart
                self.scheduler.restart(seq, prompt_len, max_new)
            if out.finish_reason is not None:
                done = UtteranceDone(
                    text=out.text,
                    num_tokens=out.num_tokens,
                    num_samples=work.num_samples,
                    time_to_first_audio_s=(work.first_audio_at or now) - work.submitted_at,
                    generation_time_s=now - work.submitted_at,
                    finish_reason=out.finish_reason,
                )
                self._finish(seq, handles, done=done)

    def _finish(
        self,
        seq: Sequence,
        handles: dict[RequestHandle, Sequence],
        done: UtteranceDone | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.scheduler.finish(seq)
        self.runner.release(seq)
        handle = seq.payload.handle
        handles.pop(handle, None)
        if error is not None:
            handle.fail(error)
        elif done is not None:
            handle.emit(done)

    def _fail_all(self, error: BaseException) -> None:
        for seq in list(self.scheduler.running.values()) + list(self.scheduler.waiting):
            seq.payload.handle.fail(error)
        while True:
            try:
                kind, handle = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                handle.fail(error)
