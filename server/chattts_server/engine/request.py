"""`EngineRequest`: one utterance's life in the engine, from submission to its last chunk.

Plain Python, no tensors. The scheduler creates, advances and finishes it; the core reads its
timing and counters to report the utterance. The runner never sees it: the runner gets slot
ids and request ids through `SchedulerOutput`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .types import UtteranceDone, UtteranceRequest


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    """Queued for a free KV slot."""
    RUNNING = "running"
    """Holds a slot: prefilling or decoding."""
    FINISHED = "finished"
    """Done, cancelled or failed; holds no slot."""


class Phase(enum.Enum):
    REFINE = "refine"
    """ChatTTS's refine-text pass: the text head rewrites the sentence with prosody tags."""
    CODES = "codes"
    """Audio codes: the audio heads, with every hidden state streamed to the Decoder."""


@dataclass(eq=False)
class EngineRequest:
    """One utterance (identity semantics: one object per submission)."""

    params: UtteranceRequest
    """What the client asked for."""
    phase: Phase
    """The pass the request is in; REFINE moves to CODES on the same slot."""
    prompt_len: int
    """Tokens of the current pass's prompt."""
    max_new_tokens: int
    """Token budget of the current pass (already clamped to the slot's room)."""
    text: str
    """The text being spoken: normalized, then refined if the refine pass ran."""
    submitted_at: float
    """time.monotonic() at submission."""

    status: RequestStatus = RequestStatus.WAITING
    slot_id: int | None = None
    """The KV slot held while RUNNING."""
    num_prefilled: int = 0
    """Prompt tokens of the current pass already in the KV cache."""
    num_generated: int = 0
    """Tokens sampled in the current pass (the first comes from the prefill's last hidden)."""
    num_audio_tokens: int = 0
    """Audio codes kept (the end code excluded)."""
    num_samples: int = 0
    """PCM samples produced so far."""
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    cancelled: bool = False
    """Set by abort; the scheduler frees the slot at its next schedule, before any more work."""
    finish_reason: str | None = None
    """'eos', 'max_tokens', 'cancelled' or 'error' once FINISHED."""

    @property
    def request_id(self) -> str:
        return self.params.request_id

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

    def done(self, now: float) -> UtteranceDone:
        """The utterance's closing figures; only for a request that finished with audio codes."""
        assert self.finish_reason in ("eos", "max_tokens"), self.finish_reason
        return UtteranceDone(
            text=self.text,
            num_tokens=self.num_audio_tokens,
            num_samples=self.num_samples,
            time_to_first_audio_s=(self.first_audio_at or now) - self.submitted_at,
            generation_time_s=(self.last_audio_at or now) - self.submitted_at,
            finish_reason=self.finish_reason,
        )
