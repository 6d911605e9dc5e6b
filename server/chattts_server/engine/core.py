"""`EngineCore`: the engine's step loop, synchronous and single-threaded.

One `step()`: expire deadlines -> `scheduler.schedule()` -> `runner.execute(plan)` ->
`scheduler.update_from_output(plan, output)` -> start next passes, flush finished utterances
-> per-request outputs. No threads and no asyncio here: `ChatTTSEngine` wraps the core in a
thread with queues, and tests drive it directly.

A request's path: `add_request` (the runner prepares its prompt, the scheduler queues it) ->
`schedule` gives it a slot and prefill chunks -> decode steps, each sampling one token and
streaming audio -> the scheduler sees the end code or the budget and finishes it ->
`runner.finish` flushes the last audio -> a `RequestOutput` with `done`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import EngineConfig
from .request import EngineRequest, Phase
from .scheduler import Scheduler
from .step_io import FinishedAudio, ModelOutput, PreparedPrompt, SchedulerOutput
from .types import (
    REFINE_SAMPLING,
    EngineError,
    EngineStats,
    InvalidRequestError,
    ModelInfo,
    UtteranceDone,
    UtteranceRequest,
)

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_STEP_FAILURES = 3
"""One failed step may be one bad request; this many in a row mean the engine is broken."""


class Runner(Protocol):
    """What the core needs of the model runner (`runner.ModelRunner`; fakes in unit tests)."""

    info: ModelInfo

    def prepare(self, request_id: str, params: UtteranceRequest) -> PreparedPrompt: ...

    def start_code_pass(self, slot_id: int) -> PreparedPrompt: ...

    def execute(self, plan: SchedulerOutput) -> ModelOutput: ...

    def finish(self, slot_ids: list[int]) -> dict[int, FinishedAudio]: ...


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    audio: list[np.ndarray] = field(default_factory=list)
    """PCM chunks (float32 mono, model rate) to send, in order."""
    done: UtteranceDone | None = None
    """Set on the utterance's last step, after its last audio."""
    error: BaseException | None = None
    """The request failed (others are unaffected); no more outputs follow."""
    codes: np.ndarray | None = None
    """With `done`: (num_tokens, num_vq) audio codes of the utterance (parity tests)."""

    @property
    def finished(self) -> bool:
        return self.done is not None or self.error is not None


class EngineCore:
    def __init__(
        self,
        runner: Runner,
        num_slots: int,
        max_tokens: int,
        prefill_chunk_tokens: int,
        max_new_tokens: int,
        is_paused: Callable[[str], bool] = lambda request_id: False,
    ) -> None:
        self.runner = runner
        self.scheduler = Scheduler(num_slots, max_tokens, prefill_chunk_tokens, max_new_tokens)
        self.is_paused = is_paused
        """Whether a request's reader is behind; its generation then skips steps."""
        self.fault_hook: Callable[[UtteranceRequest], None] | None = None
        """Test seam: called for each request of each step before the model runs; may raise."""
        self.consecutive_failures = 0
        """Steps in a row whose model execution raised."""
        self.tokens_generated = 0
        self.ran_model = False
        """The last step computed something (False: nothing runnable, e.g. all readers behind)."""
        self._requests: dict[str, EngineRequest] = {}

    @classmethod
    def from_config(
        cls,
        runner: Runner,
        config: EngineConfig,
        is_paused: Callable[[str], bool] = lambda request_id: False,
    ) -> EngineCore:
        return cls(
            runner,
            num_slots=config.max_streams,
            max_tokens=config.max_tokens,
            prefill_chunk_tokens=config.prefill_chunk_tokens,
            max_new_tokens=config.max_new_tokens,
            is_paused=is_paused,
        )

    # -- requests in -----------------------------------------------------------------------

    def add_request(self, params: UtteranceRequest) -> EngineRequest:
        """Prepare and queue one utterance. Raises InvalidRequestError (nothing is queued)."""
        if params.request_id in self._requests:
            raise InvalidRequestError("request_id", f"{params.request_id!r} is already running")
        prepared = self.runner.prepare(params.request_id, params)
        if prepared.phase is Phase.REFINE:
            budget = self.scheduler.fit(prepared.prompt_len, REFINE_SAMPLING.max_new_tokens)
        else:
            s = params.sampling
            budget = self.scheduler.fit(prepared.prompt_len, s.max_new_tokens, s.min_new_tokens)
        request = EngineRequest(
            params=params,
            phase=prepared.phase,
            prompt_len=prepared.prompt_len,
            max_new_tokens=budget,
            text=prepared.text,
            submitted_at=time.monotonic(),
        )
        self.scheduler.add(request)
        self._requests[params.request_id] = request
        return request

    def abort_request(self, request_id: str) -> None:
        """Stop a request (client gone); its slot is free before the next step computes."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            self.scheduler.cancel(request)

    @property
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_requests

    def stats(self) -> EngineStats:
        return EngineStats(
            active_requests=len(self.scheduler.running),
            waiting_requests=len(self.scheduler.waiting),
            num_slots=self.scheduler.num_slots,
            tokens_generated=self.tokens_generated,
        )

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one engine step; outputs for the requests that produced audio or finished.

        Raises only when `MAX_CONSECUTIVE_STEP_FAILURES` steps in a row have failed."""
        outputs: dict[str, RequestOutput] = {}
        self._expire_deadlines(outputs)
        plan = self.scheduler.schedule(lambda r: self.is_paused(r.request_id))
        self._inject_faults(plan, outputs)
        self.ran_model = plan.has_model_work
        # The slots computed this step, mapped before the scheduler frees any of them.
        by_slot = {slot_id: self.scheduler.running[slot_id] for slot_id in plan.slot_ids}
        try:
            model_output = self.runner.execute(plan)
        except Exception:
            self.consecutive_failures += 1
            log.exception("engine step failed (%d in a row)", self.consecutive_failures)
            for request in by_slot.values():
                self._fail(request, EngineError("internal error during generation"), outputs)
            if self.consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise
            return list(outputs.values())
        self.consecutive_failures = 0
        self.tokens_generated += len(model_output.sampled)
        decisions = self.scheduler.update_from_output(plan, model_output)

        now = time.monotonic()
        for slot_id, chunks in model_output.audio.items():
            self._emit_audio(by_slot[slot_id], chunks, now, outputs)
        for request in decisions.next_pass:
            assert request.slot_id is not None
            try:
                prepared = self.runner.start_code_pass(request.slot_id)
                self.scheduler.begin_pass(request, Phase.CODES, prepared.prompt_len)
                request.text = prepared.text
            except InvalidRequestError as exc:
                self._fail(request, exc, outputs)
            except Exception:
                log.exception("request %s: the audio-code prompt failed", request.request_id)
                self._fail(request, EngineError("could not prepare the audio-code prompt"), outputs)
        if decisions.finished:
            try:
                tails = self.runner.finish([r.slot_id for r in decisions.finished])  # type: ignore[misc]
            except Exception:
                log.exception(
                    "flushing the last audio of %d requests failed", len(decisions.finished)
                )
                for request in decisions.finished:
                    self._requests.pop(request.request_id, None)
                    self._output(request, outputs).error = EngineError("internal error at the end")
                return list(outputs.values())
            for request in decisions.finished:
                assert request.slot_id is not None
                tail = tails[request.slot_id]
                self._emit_audio(request, [tail.pcm], now, outputs)
                out = self._output(request, outputs)
                out.done, out.codes = request.done(now), tail.codes
                self._requests.pop(request.request_id, None)
                if request.finish_reason == "max_tokens":
                    log.warning(
                        "request %s reached its token cap (%d): the sentence may be cut",
                        request.request_id,
                        request.max_new_tokens,
                    )
        return list(outputs.values())

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _output(request: EngineRequest, outputs: dict[str, RequestOutput]) -> RequestOutput:
        return outputs.setdefault(request.request_id, RequestOutput(request.request_id))

    def _emit_audio(
        self,
        request: EngineRequest,
        chunks: list[np.ndarray],
        now: float,
        outputs: dict[str, RequestOutput],
    ) -> None:
        chunks = [pcm for pcm in chunks if pcm.size]
        if not chunks:
            return
        for pcm in chunks:
            request.record_audio(len(pcm), now)
        self._output(request, outputs).audio.extend(chunks)

    def _fail(
        self, request: EngineRequest, error: BaseException, outputs: dict[str, RequestOutput]
    ) -> None:
        self.scheduler.fail(request)
        self._requests.pop(request.request_id, None)
        self._output(request, outputs).error = error

    def _expire_deadlines(self, outputs: dict[str, RequestOutput]) -> None:
        # Before scheduling, so no plan ever holds a request whose slot is being released.
        now = time.monotonic()
        for request in list(self._requests.values()):
            deadline = request.params.deadline
            if deadline is not None and now > deadline:
                self._fail(request, TimeoutError("deadline exceeded"), outputs)

    def _inject_faults(self, plan: SchedulerOutput, outputs: dict[str, RequestOutput]) -> None:
        """Run the test seam: a request whose hook raises fails alone, before the model runs."""
        if self.fault_hook is None:
            return
        failed: set[int] = set()
        for slot_id in plan.slot_ids:
            request = self.scheduler.running[slot_id]
            try:
                self.fault_hook(request.params)
            except Exception as exc:
                log.error("request %s failed: %s", request.request_id, exc, exc_info=True)
                self._fail(request, EngineError(str(exc)[:200]), outputs)
                failed.add(slot_id)
        if failed:
            plan.prefill = [c for c in plan.prefill if c.slot_id not in failed]
            plan.pass_starts = [s for s in plan.pass_starts if s.slot_id not in failed]
            plan.decode = [r for r in plan.decode if r.slot_id not in failed]
