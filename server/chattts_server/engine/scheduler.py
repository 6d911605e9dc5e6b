"""Slot scheduler: admission into KV-cache slots, chunked prefill, continuous batching.

Plain Python, no tensors: the scheduler owns slot ids and per-sequence bookkeeping; the model
runner owns the tensors those ids index. Each engine step asks `schedule()` for a `StepPlan`.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Phase(enum.Enum):
    WAITING = "waiting"
    """Queued for a free slot."""
    RUNNING = "running"
    """Holds a slot: prefilling or decoding."""
    FINISHED = "finished"
    """Done, cancelled or failed; holds no slot."""


@dataclass(eq=False)
class Sequence:
    """Scheduler state of one utterance generation (identity semantics: one object per request)."""

    request_id: str
    prompt_len: int
    """Tokens of the prompt to prefill."""
    max_new_tokens: int
    payload: Any = None
    """Opaque per-request state of the engine (prompt tensors, streams, output queue)."""
    phase: Phase = Phase.WAITING
    slot_id: int | None = None
    num_prefilled: int = 0
    """Prompt tokens already in the KV cache."""
    num_generated: int = 0
    """Tokens sampled so far in the current pass (the first comes from the prefill's last hidden)."""
    cancelled: bool = False

    @property
    def prefill_done(self) -> bool:
        return self.num_prefilled >= self.prompt_len

    @property
    def input_position(self) -> int:
        """KV position of the next decode step's input (the last sampled token)."""
        return self.prompt_len + self.num_generated - 1


@dataclass
class PrefillChunk:
    seq: Sequence
    start: int
    """First prompt position of the chunk."""
    length: int
    """Prompt tokens in the chunk."""

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.length >= self.seq.prompt_len


@dataclass
class StepPlan:
    """What the runner does in one engine step."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    """Prompt chunks to write into the KV cache this step (each in its sequence's slot)."""
    decode: list[Sequence] = field(default_factory=list)
    """Sequences that decode one token this step, batched, each at its own position."""
    aborted: list[Sequence] = field(default_factory=list)
    """Cancelled sequences released this step; the engine notifies their readers."""

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode or self.aborted)


class Scheduler:
    def __init__(self, num_slots: int, max_tokens: int, prefill_chunk_tokens: int) -> None:
        self.num_slots = num_slots
        self.max_tokens = max_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._free_slots = list(range(num_slots))
        heapq.heapify(self._free_slots)
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def add(self, seq: Sequence) -> None:
        if seq.prompt_len + seq.max_new_tokens > self.max_tokens:
            raise ValueError(
                f"prompt ({seq.prompt_len}) + max_new_tokens ({seq.max_new_tokens}) exceed "
                f"the {self.max_tokens} KV positions of a slot"
            )
        seq.phase = Phase.WAITING
        self.waiting.append(seq)

    def cancel(self, seq: Sequence) -> None:
        """Mark for release; the slot is freed at the next `schedule()`, before any more work."""
        seq.cancelled = True

    def restart(self, seq: Sequence, prompt_len: int, max_new_tokens: int) -> None:
        """Start a new pass on the same slot (e.g. audio codes after the refine-text pass)."""
        if prompt_len + max_new_tokens > self.max_tokens:
            raise ValueError("second pass does not fit the slot")
        seq.prompt_len = prompt_len
        seq.max_new_tokens = max_new_tokens
        seq.num_prefilled = 0
        seq.num_generated = 0

    def finish(self, seq: Sequence) -> None:
        """Release a sequence's slot (EOS, max tokens, error)."""
        if seq.phase is Phase.RUNNING and seq.slot_id is not None:
            del self.running[seq.slot_id]
            heapq.heappush(self._free_slots, seq.slot_id)
        elif seq.phase is Phase.WAITING:
            self.waiting.remove(seq)
        seq.phase = Phase.FINISHED
        seq.slot_id = None

    def schedule(self, is_paused: Callable[[Sequence], bool] = lambda s: False) -> StepPlan:
        plan = StepPlan()
        for seq in [s for s in self.waiting if s.cancelled]:
            self.finish(seq)
            plan.aborted.append(seq)
        for seq in [s for s in self.running.values() if s.cancelled]:
            self.finish(seq)
            plan.aborted.append(seq)

        while self.waiting and self._free_slots:
            seq = self.waiting.popleft()
            seq.slot_id = heapq.heappop(self._free_slots)
            seq.phase = Phase.RUNNING
            self.running[seq.slot_id] = seq

        budget = self.prefill_chunk_tokens
        for slot_id in sorted(self.running):
            seq = self.running[slot_id]
            if seq.prefill_done:
                if not is_paused(seq):
                    plan.decode.append(seq)
            elif budget > 0:
                length = min(budget, seq.prompt_len - seq.num_prefilled)
                plan.prefill.append(PrefillChunk(seq, seq.num_prefilled, length))
                budget -= length
        return plan
