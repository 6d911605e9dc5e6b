"""Slot scheduler: admission into KV-cache slots, chunked prefill, continuous batching, and
every decision about a request's life (when a pass ends, when it stops, which slot it frees).

Plain Python, no tensors: the scheduler owns slot ids and `EngineRequest`s; the model runner
owns the tensors those ids index. Each step: `schedule()` plans (`SchedulerOutput`), the
runner executes all of it in one call, `update_from_output()` reads the `ModelOutput`, decides
which passes ended, and hands the core what each request produced (`StepDecisions`). A pass
that ended is acted on by the next plan: its utterance is flushed there (the slot is free from
that plan on) or, after the refine pass, its audio-code prompt is built there.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidRequestError, RequestFailure
from .request import EngineRequest, RequestStatus
from .step_io import (
    DecodeRow,
    FinishedAudio,
    ModelOutput,
    NewSlot,
    PrefillChunk,
    PreparedPrompt,
    SchedulerOutput,
)
from .utterance import Priority


@dataclass
class StepDecisions:
    """What one step's `ModelOutput` means for the step's requests, in the order the core
    reports it: audio, failures, finished utterances."""

    audio: list[tuple[EngineRequest, list[np.ndarray]]] = field(default_factory=list)
    """PCM chunks that became ready, per request, in order."""
    failed: list[tuple[EngineRequest, RequestFailure]] = field(default_factory=list)
    """Requests whose work failed alone, with the error they end with; their slots are free."""
    completed: list[tuple[EngineRequest, FinishedAudio]] = field(default_factory=list)
    """Utterances the runner flushed this step ('eos' or 'max_tokens'): their last audio."""


class Scheduler:
    def __init__(
        self,
        num_slots: int,
        max_tokens: int,
        prefill_chunk_tokens: int,
        max_new_tokens: int | None = None,
        interactive_hold_tokens: int = 0,
    ) -> None:
        self.num_slots = num_slots
        self.interactive_hold_tokens = interactive_hold_tokens
        """While an INTERACTIVE request has sent no audio and its pass has sampled fewer
        tokens than this, less urgent requests skip decode steps (0: never)."""
        self.max_tokens = max_tokens
        """KV positions per slot: a pass's prompt plus its generated tokens must fit."""
        self.prefill_chunk_tokens = prefill_chunk_tokens
        """Prompt tokens prefilled per step at most, over all slots."""
        self.max_new_tokens = max_new_tokens or max_tokens - 1
        """Token budget of a pass whose request leaves it unset."""
        self._num_arrivals = 0
        """Requests added so far: each one's `arrival` number."""
        self._free_slots = list(range(num_slots))
        heapq.heapify(self._free_slots)
        self.waiting: deque[EngineRequest] = deque()
        self.running: dict[int, EngineRequest] = {}
        self._released: list[int] = []
        self._flushing: dict[int, EngineRequest] = {}
        """The utterances the current plan flushes, by the slot they held (free already: the
        same plan may give it to a new request)."""

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def has_requests(self) -> bool:
        return bool(self.running or self.waiting)

    # -- requests in ---------------------------------------------------------------------

    def add(self, request: EngineRequest, prepared: PreparedPrompt) -> None:
        """Queue a new request with its first pass (`ModelRunner.prepare`). Raises
        InvalidRequestError when that prompt leaves its slot too little room."""
        self._budget_pass(request, prepared)
        request.pass_state = prepared.state
        request.status = RequestStatus.WAITING
        request.arrival = self._num_arrivals
        self._num_arrivals += 1
        self.waiting.append(request)

    def cancel(self, request: EngineRequest) -> None:
        """Mark for release; the slot is freed at the next `schedule()`, before any more work."""
        request.cancelled = True

    def fail(self, request: EngineRequest) -> None:
        """End a request that failed on its own; its slot's state is dropped next step."""
        self._finish(request, "error")

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
        plan = SchedulerOutput(released=self._released)
        self._released = []
        self._act_on_ended_passes(plan)
        while self.waiting and self._free_slots:
            request = min(self.waiting, key=_rank)  # the most urgent class, then arrival
            self.waiting.remove(request)
            request.slot_id = heapq.heappop(self._free_slots)
            request.status = RequestStatus.RUNNING
            self.running[request.slot_id] = request
            state, request.pass_state = request.pass_state, None  # the runner holds it now
            plan.new_slots.append(NewSlot(request.request_id, request.slot_id, state))
        self._plan_rows(plan, is_paused)
        return plan

    def update_from_output(self, plan: SchedulerOutput, output: ModelOutput) -> StepDecisions:
        """Advance the step's requests, decide which passes ended, and say what each request
        produced."""
        decisions = StepDecisions()
        flushed, self._flushing = self._flushing, {}
        decisions.completed = [(flushed[slot_id], end) for slot_id, end in output.flushed.items()]
        # The request each slot of the plan computed for, before anything below frees a slot.
        owners = {s: self.running[s] for s in [*plan.slot_ids, *plan.next_pass]}
        for chunk in plan.prefill:
            owners[chunk.slot_id].num_prefilled += chunk.length
        for slot_id, error in output.failed.items():
            self._fail_alone(owners[slot_id], error, decisions)
        for slot_id, prepared in output.prepared.items():
            try:
                self._budget_pass(owners[slot_id], prepared)
            except InvalidRequestError as exc:
                self._fail_alone(owners[slot_id], exc, decisions)
        for sampled in output.sampled:
            request = owners[sampled.slot_id]
            if request.status is not RequestStatus.RUNNING:
                continue  # failed in this step
            request.num_generated += 1
            if sampled.is_end:
                request.pass_end = "eos"
            elif request.num_generated >= request.max_new_tokens:
                request.pass_end = "max_tokens"
        for slot_id, chunks in output.audio.items():
            if owners[slot_id].status is RequestStatus.RUNNING:
                decisions.audio.append((owners[slot_id], chunks))
        return decisions

    def abandon(self, plan: SchedulerOutput) -> list[EngineRequest]:
        """The runner raised on `plan`: every request it was for fails (their slots' state is
        dropped next step). Returns them."""
        computed = [self.running[s] for s in dict.fromkeys([*plan.slot_ids, *plan.next_pass])]
        flushed, self._flushing = list(self._flushing.values()), {}
        for request in computed:
            self._finish(request, "error")
        for request in flushed:  # their slots are free already; drop what the flush left
            assert request.slot_id is not None
            request.finish_reason = "error"
            self._released.append(request.slot_id)
        return computed + flushed

    # -- internals -----------------------------------------------------------------------

    def _budget_pass(self, request: EngineRequest, prepared: PreparedPrompt) -> None:
        """Give a pass (the first, or the next on the slot the request holds) its prompt length
        and its token budget, clamped to the room the slot has after the prompt. Raises
        InvalidRequestError when the prompt leaves too little room."""
        room = self.max_tokens - prepared.prompt_len
        # Every pass samples at least the token its prompt's last position gives.
        if room < 1 or room < prepared.min_new_tokens:
            raise InvalidRequestError(
                "text",
                f"the prompt takes {prepared.prompt_len} of the {self.max_tokens} positions of a "
                f"KV slot (--max-tokens), leaving too few for "
                f"{max(1, prepared.min_new_tokens)} tokens",
            )
        request.max_new_tokens = min(prepared.max_new_tokens or self.max_new_tokens, room)
        request.prompt_len = prepared.prompt_len
        request.final_pass = prepared.final
        request.spoken = prepared.spoken
        request.num_prefilled = 0
        request.num_generated = 0
        request.pass_end = None

    def _act_on_ended_passes(self, plan: SchedulerOutput) -> None:
        """Passes that ended last step: a last pass's utterance is flushed in this plan and its
        slot is free from now on; a refine pass gets its audio-code prompt built."""
        for slot_id in sorted(self.running):
            request = self.running[slot_id]
            if request.pass_end is None:
                continue
            if request.final_pass:
                plan.slots_to_flush.append(slot_id)
                self._flushing[slot_id] = request
                self._finish(request, request.pass_end, release=False)
            else:
                plan.next_pass.append(slot_id)

    def _plan_rows(self, plan: SchedulerOutput, is_paused: Callable[[EngineRequest], bool]) -> None:
        """The step's model rows: each decoding slot's token, in slot order, and prompt chunks
        within the step's prefill budget, the most urgent class first, then arrival: a
        navigation prompt's prefill is not held behind a backlog's. While an INTERACTIVE
        request waits for its first audio (`_first_audio_hold`), less urgent requests neither
        decode nor prefill."""
        prefilling: list[EngineRequest] = []
        holding = self._first_audio_hold()
        for slot_id in sorted(self.running):
            request = self.running[slot_id]
            if request.pass_end is not None:
                continue  # waiting for its next prompt (`next_pass`)
            if not request.prefill_done:
                prefilling.append(request)
            elif not is_paused(request) and not (
                holding is not None and request.priority > holding
            ):
                row = DecodeRow(slot_id, request.input_position, request.num_generated)
                plan.decode.append(row)
        budget = self.prefill_chunk_tokens
        for request in sorted(prefilling, key=_rank):
            if budget <= 0 or (holding is not None and request.priority > holding):
                break  # the rest are as urgent or less, and held the same
            assert request.slot_id is not None
            length = min(budget, request.prompt_len - request.num_prefilled)
            completes = request.num_prefilled + length >= request.prompt_len
            chunk = PrefillChunk(request.slot_id, request.num_prefilled, length, completes)
            plan.prefill.append(chunk)
            budget -= length

    def _first_audio_hold(self) -> Priority | None:
        """INTERACTIVE while such a request in a slot waits for its first audio (within
        `interactive_hold_tokens` of its pass): its first chunk then needs ~16 steps at a small
        batch, not at the backlog's, which on a 2-core CPU is several times slower per step.
        None when nothing holds the others back."""
        limit = self.interactive_hold_tokens
        for request in self.running.values():
            if (
                request.priority is Priority.INTERACTIVE
                and request.first_audio_at is None
                and request.num_generated < limit
            ):
                return Priority.INTERACTIVE
        return None

    def _fail_alone(
        self, request: EngineRequest, error: RequestFailure, decisions: StepDecisions
    ) -> None:
        self._finish(request, "error")
        decisions.failed.append((request, error))

    def _finish(self, request: EngineRequest, reason: str, release: bool = True) -> None:
        """Free the request's slot. `release`: the runner drops the slot's state at the next
        step (cancel, failure); otherwise the plan being built flushes it (`finished`)."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.RUNNING and request.slot_id is not None:
            del self.running[request.slot_id]
            heapq.heappush(self._free_slots, request.slot_id)
            if release:
                self._released.append(request.slot_id)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
            request.pass_state = None
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason


def _rank(request: EngineRequest) -> tuple[int, int]:
    return request.rank
