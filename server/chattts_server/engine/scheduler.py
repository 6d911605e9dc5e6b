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

from .request import EngineRequest, Phase, RequestStatus
from .step_io import (
    DecodeRow,
    ModelOutput,
    NewSlot,
    PassStart,
    PrefillChunk,
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
    """Refine passes that ended: they keep their slot and need their audio-code prompt
    (`ModelRunner.start_code_pass`, then `Scheduler.begin_pass`)."""


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

    def fit(self, prompt_len: int, max_new_tokens: int | None, min_new_tokens: int = 0) -> int:
        """A pass's token budget, clamped to the room a slot has left after its prompt."""
        room = self.max_tokens - prompt_len
        need = max(1, min_new_tokens)
        if room < need:
            raise InvalidRequestError(
                "text",
                f"the prompt takes {prompt_len} of the {self.max_tokens} positions of a KV slot "
                f"(--max-tokens), leaving too few for {need} tokens",
            )
        return min(max_new_tokens or self.max_new_tokens, room)

    def add(self, request: EngineRequest) -> None:
        """Queue a request whose prompt and budget fit a slot (see `fit`)."""
        if request.prompt_len + request.max_new_tokens > self.max_tokens:
            raise InvalidRequestError(
                "text", f"prompt and token budget exceed the {self.max_tokens} positions of a slot"
            )
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
                if completes:
                    plan.pass_starts.append(PassStart(slot_id, request.phase, request.params))
                budget -= length
        return plan

    def update_from_output(self, plan: SchedulerOutput, output: ModelOutput) -> StepDecisions:
        """Advance the step's requests and decide which end, fail, or move to their next pass."""
        decisions = StepDecisions()
        for chunk in plan.prefill:
            self.running[chunk.slot_id].num_prefilled += chunk.length
        for sampled in output.sampled:
            request = self.running[sampled.slot_id]
            request.num_generated += 1
            if request.phase is Phase.CODES and not sampled.is_end:
                request.num_audio_tokens += 1
            if not (sampled.is_end or request.num_generated >= request.max_new_tokens):
                continue
            if request.phase is Phase.REFINE:
                decisions.next_pass.append(request)
            else:
                self._finish(request, "eos" if sampled.is_end else "max_tokens", release=False)
                decisions.finished.append(request)
        return decisions

    def begin_pass(self, request: EngineRequest, phase: Phase, prompt_len: int) -> None:
        """Start the request's next pass on the slot it holds (audio codes after refine)."""
        sampling = request.params.sampling
        request.max_new_tokens = self.fit(
            prompt_len, sampling.max_new_tokens, sampling.min_new_tokens
        )
        request.phase = phase
        request.prompt_len = prompt_len
        request.num_prefilled = 0
        request.num_generated = 0

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
