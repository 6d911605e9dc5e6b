"""Slot scheduler: admission into KV-cache slots, chunked prefill, continuous batching, and
every decision about a request's life (when a pass ends, when it stops, which slot it frees).

Plain Python, no tensors: the scheduler owns slot ids and `EngineRequest`s; the model runner
owns the tensors those ids index. Each step: `schedule()` plans (`SchedulerOutput`), the
runner executes, `update_from_output()` reads the `ModelOutput` and decides.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .request import EngineRequest, RequestStatus
from .step_io import (
    DecodeRow,
    ModelOutput,
    NewSlot,
    PrefillChunk,
    PreparedPrompt,
    SchedulerOutput,
)
from .types import InvalidRequestError


@dataclass
class StepDecisions:
    """What `update_from_output` decided for the requests of one step."""

    finished: list[EngineRequest] = field(default_factory=list)
    """Utterances complete ('eos' or 'max_tokens'); their slots are free, their audio tail is
    still in the runner (flush it with `ModelRunner.finish`)."""
    next_pass: list[EngineRequest] = field(default_factory=list)
    """Passes that ended but not the utterance (refine): they keep their slot and need their
    next prompt (`ModelRunner.start_code_pass`, then `Scheduler.begin_pass`)."""
    failed: list[tuple[EngineRequest, str]] = field(default_factory=list)
    """Requests whose work failed alone in the runner, with its reason; their slots are free."""


class Scheduler:
    def __init__(
        self,
        num_slots: int,
        max_tokens: int,
        prefill_chunk_tokens: int,
        max_new_tokens: int | None = None,
    ) -> None:
        self.num_slots = num_slots
        self.max_tokens = max_tokens
        """KV positions per slot: a pass's prompt plus its generated tokens must fit."""
        self.prefill_chunk_tokens = prefill_chunk_tokens
        """Prompt tokens prefilled per step at most, over all slots."""
        self.max_new_tokens = max_new_tokens or max_tokens - 1
        """Token budget of a pass whose request leaves it unset."""
        self._free_slots = list(range(num_slots))
        heapq.heapify(self._free_slots)
        self.waiting: deque[EngineRequest] = deque()
        self.running: dict[int, EngineRequest] = {}
        self._released: list[int] = []
        self._discarded: list[str] = []

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def has_requests(self) -> bool:
        return bool(self.running or self.waiting)

    # -- requests in ---------------------------------------------------------------------

    def begin_pass(self, request: EngineRequest, prepared: PreparedPrompt) -> None:
        """Set up a pass (the first, or the next on the slot the request holds): its prompt
        length and its token budget, clamped to the room the slot has after the prompt.
        Raises InvalidRequestError when the prompt leaves too little room."""
        room = self.max_tokens - prepared.prompt_len
        need = max(1, prepared.min_new_tokens)
        if room < need:
            raise InvalidRequestError(
                "text",
                f"the prompt takes {prepared.prompt_len} of the {self.max_tokens} positions of a "
                f"KV slot (--max-tokens), leaving too few for {need} tokens",
            )
        request.max_new_tokens = min(prepared.max_new_tokens or self.max_new_tokens, room)
        request.prompt_len = prepared.prompt_len
        request.final_pass = prepared.final
        request.num_prefilled = 0
        request.num_generated = 0

    def add(self, request: EngineRequest) -> None:
        """Queue a request whose first pass has begun (`begin_pass`)."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def cancel(self, request: EngineRequest) -> None:
        """Mark for release; the slot is freed at the next `schedule()`, before any more work."""
        request.cancelled = True

    # -- one step ------------------------------------------------------------------------

    def schedule(
        self, is_paused: Callable[[EngineRequest], bool] = lambda r: False
    ) -> SchedulerOutput:
        """Plan the next step. `is_paused(request)` skips a decoding request this step (its
        reader is behind); it keeps its slot."""
        for request in [r for r in self.waiting if r.cancelled]:
            self._finish(request, "cancelled")
        for request in [r for r in self.running.values() if r.cancelled]:
            self._finish(request, "cancelled")
        plan = SchedulerOutput(released=self._released, discarded=self._discarded)
        self._released, self._discarded = [], []

        while self.waiting and self._free_slots:
            request = self.waiting.popleft()
            request.slot_id = heapq.heappop(self._free_slots)
            request.status = RequestStatus.RUNNING
            self.running[request.slot_id] = request
            plan.new_slots.append(NewSlot(request.request_id, request.slot_id))

        budget = self.prefill_chunk_tokens
        for slot_id in sorted(self.running):
            request = self.running[slot_id]
            if request.prefill_done:
                if not is_paused(request):
                    plan.decode.append(DecodeRow(slot_id, request.input_position))
            elif budget > 0:
                length = min(budget, request.prompt_len - request.num_prefilled)
                completes = request.num_prefilled + length >= request.prompt_len
                plan.prefill.append(PrefillChunk(slot_id, request.num_prefilled, length, completes))
                budget -= length
        return plan

    def update_from_output(self, plan: SchedulerOutput, output: ModelOutput) -> StepDecisions:
        """Advance the step's requests and decide which end, fail, or move to their next pass."""
        decisions = StepDecisions()
        for chunk in plan.prefill:
            self.running[chunk.slot_id].num_prefilled += chunk.length
        for slot_id, reason in output.failed.items():
            request = self.running[slot_id]
            self._finish(request, "error")
            decisions.failed.append((request, reason))
        for sampled in output.sampled:
            if sampled.slot_id in output.failed:
                continue
            request = self.running[sampled.slot_id]
            request.num_generated += 1
            if not (sampled.is_end or request.num_generated >= request.max_new_tokens):
                continue
            if not request.final_pass:
                decisions.next_pass.append(request)
            else:
                self._finish(request, "eos" if sampled.is_end else "max_tokens", release=False)
                decisions.finished.append(request)
        return decisions

    def fail(self, request: EngineRequest) -> None:
        """End a request that failed on its own; its slot's state is dropped next step."""
        self._finish(request, "error")

    # -- internals -----------------------------------------------------------------------

    def _finish(self, request: EngineRequest, reason: str, release: bool = True) -> None:
        """Free the request's slot. `release`: the runner drops the slot's state at the next
        step (cancel, failure); otherwise the caller flushes it now (`ModelRunner.finish`)."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.RUNNING and request.slot_id is not None:
            del self.running[request.slot_id]
            heapq.heappush(self._free_slots, request.slot_id)
            if release:
                self._released.append(request.slot_id)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
            self._discarded.append(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
