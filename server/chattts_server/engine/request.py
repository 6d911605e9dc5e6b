"""`EngineRequest`: one utterance's life in the engine, from submission to its last chunk.

Plain Python, no tensors: the slot, the counters, the budget and how it ended. The scheduler
advances and finishes it; the core reads its timing to report the utterance. What the request
says and what its passes are (prompt, phase, sampling, text, codes) is the runner's, which
gets slot ids and request ids through `SchedulerOutput`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..text.spans import Traced
from .events import UtteranceDone
from .step_io import FinishedAudio
from .utterance import Priority


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    """Queued for a free KV slot."""
    RUNNING = "running"
    """Holds a slot: prefilling or decoding."""
    FINISHED = "finished"
    """Done, cancelled or failed; holds no slot."""


@dataclass(eq=False)
class EngineRequest:
    """One utterance (identity semantics: one object per submission)."""

    request_id: str
    submitted_at: float
    """time.monotonic() at submission."""
    deadline: float | None = None
    """time.monotonic() past which the request fails with DEADLINE_EXCEEDED."""
    expires_at: float | None = None
    """time.monotonic() past which it is dropped with ExpiredError if not yet prefilling."""
    prompt_len: int = 0
    """Tokens of the current pass's prompt (`Scheduler._budget_pass`)."""
    max_new_tokens: int = 0
    """Token budget of the current pass (clamped to the slot's room)."""
    final_pass: bool = True
    """The current pass's end ends the utterance (False during refine)."""
    priority: Priority = Priority.DEFAULT
    """Its stream's class: seats and prefill budget go to lower values first."""
    arrival: int = 0
    """Submission order (the scheduler numbers requests): ties within a class go by it."""

    status: RequestStatus = RequestStatus.WAITING
    slot_id: int | None = None
    """The KV slot held while RUNNING."""
    num_prefilled: int = 0
    """Prompt tokens of the current pass already in the KV cache."""
    num_generated: int = 0
    """Tokens sampled in the current pass (the first comes from the prefill's last hidden):
    the one count of them, handed to the runner in each `DecodeRow`."""
    pass_end: str | None = None
    """How the current pass ended, 'eos' or 'max_tokens', once the step that sampled its last
    token is read; the next plan then flushes the utterance or asks for its next prompt."""
    num_samples: int = 0
    """PCM samples produced so far."""
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    cancelled: bool = False
    """Set by abort; the scheduler frees the slot at its next schedule, before any more work."""
    finish_reason: str | None = None
    """'eos', 'max_tokens', 'cancelled' or 'error' once FINISHED."""
    spoken: Traced | None = None
    """What the final pass speaks (its `PreparedPrompt.spoken`), sent with the first audio."""
    pass_state: object = None
    """The runner's first pass (`PreparedPrompt.state`), held while WAITING, opaque here."""

    @property
    def rank(self) -> tuple[int, int]:
        """Who goes first: the more urgent class, then the earlier arrival."""
        return (self.priority, self.arrival)

    @property
    def prefill_done(self) -> bool:
        return self.num_prefilled >= self.prompt_len

    @property
    def input_position(self) -> int:
        """KV position of the next decode step's input (the last sampled token)."""
        return self.prompt_len + self.num_generated - 1

    def record_audio(self, num_samples: int, now: float) -> None:
        if self.first_audio_at is None:
            self.first_audio_at = now
        self.last_audio_at = now
        self.num_samples += num_samples

    def utterance_done(self, now: float, end: FinishedAudio) -> UtteranceDone:
        """The utterance's closing figures; only for a request that finished its last pass."""
        assert self.finish_reason in ("eos", "max_tokens"), self.finish_reason
        return UtteranceDone(
            text=end.text,
            num_tokens=len(end.codes),
            num_samples=self.num_samples,
            time_to_first_audio_s=(self.first_audio_at or now) - self.submitted_at,
            generation_time_s=(self.last_audio_at or now) - self.submitted_at,
            finish_reason=self.finish_reason,
            spoken=end.spoken,
            alignment=end.alignment,
        )
