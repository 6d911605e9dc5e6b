"""The per-step contract between the scheduler and the model runner.

`SchedulerOutput` is what the scheduler hands the runner for one step: ids, positions, lengths
and what happens to each slot, so that `ModelRunner.execute` does the whole step in one call.
`ModelOutput` is what the runner hands back, keyed by slot id: what it sampled, the audio that
became ready, the utterances it flushed and the prompts it built. Neither side reaches into the
other's state: the scheduler never sees a tensor, the runner never sees an `EngineRequest`, and
only the scheduler decides that a pass ends (it reads the end code in `Sampled`, and counts the
budget) and what follows: the next plan carries the decision, as vLLM v1's scheduler output
carries the requests that finished since the last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import RequestFailure
from ..text.spans import Traced
from ..timing.types import TokenAlignment


@dataclass(frozen=True)
class PreparedPrompt:
    """A pass the runner has built a prompt for (`prepare`, or a plan's `next_pass`): what the
    scheduler needs to give it a budget and to know what its end means."""

    prompt_len: int
    max_new_tokens: int | None
    """The pass's token cap as the request asks (None: the server's); clamped to the slot."""
    min_new_tokens: int = 0
    """Tokens the pass samples before its end token is allowed (the audio pass: at least 1)."""
    final: bool = True
    """Its end ends the utterance; False for the refine pass (audio codes follow, same slot)."""
    spoken: Traced | None = None
    """The final pass: the text its audio speaks, traced to the request's source (sent to the
    reader with the first audio, `events.Spoken`)."""
    state: object = field(default=None, repr=False, compare=False)
    """The runner's state of the pass (`passes.PassState`), opaque to the scheduler, which
    holds it until the request gets a slot and hands it back in `NewSlot`."""


@dataclass(frozen=True)
class NewSlot:
    """A request that took a KV slot this step; the runner seats its pass there."""

    request_id: str
    """The id `ModelRunner.prepare` was called with."""
    slot_id: int
    """The slot it now holds until it finishes or is cancelled."""
    state: object = field(default=None, repr=False, compare=False)
    """Its first pass, as `PreparedPrompt.state` held it."""


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt positions [start, start + length) of one slot's current pass, written this step."""

    slot_id: int
    start: int
    """First prompt position of the chunk (prompts longer than the step budget take several)."""
    length: int
    """Prompt tokens in the chunk."""
    completes_prompt: bool
    """The last chunk: the runner samples the pass's first token from its last hidden state."""


@dataclass(frozen=True)
class DecodeRow:
    """One slot that decodes one token this step, batched with the others."""

    slot_id: int
    position: int
    """KV position of its input, the token sampled last step."""
    num_generated: int
    """Tokens its pass has sampled so far (the scheduler's count; the sampler masks the end
    token by it and files the new token in the repetition window by it)."""


@dataclass
class SchedulerOutput:
    """What the runner does in one step. Field order is execution order."""

    released: list[int] = field(default_factory=list)
    """Slots given up since the last step (cancelled or failed): drop their state first; a
    slot here may be handed to a new request in `new_slots` of the same step."""
    slots_to_flush: list[int] = field(default_factory=list)
    """Slots whose utterance ended last step (end code or token cap): flush their decoders
    (batched) into `ModelOutput.flushed` and drop their state. These slots are free: one may
    be handed to a new request in `new_slots` of the same step."""
    next_pass: list[int] = field(default_factory=list)
    """Slots whose refine pass ended last step: build each one's audio-code prompt from the
    refined text into `ModelOutput.prepared` (or fail it in `ModelOutput.failed`). They keep
    their slot and compute nothing else this step; their prefill is planned from the next."""
    new_slots: list[NewSlot] = field(default_factory=list)
    """Requests that took a slot this step, with the pass `prepare` built."""
    prefill: list[PrefillChunk] = field(default_factory=list)
    """Prompt chunks to write into the KV cache, at most the scheduler's token budget; a chunk
    that completes its prompt samples the pass's first token."""
    decode: list[DecodeRow] = field(default_factory=list)
    """Slots that decode one token, in slot order (so a packed batch is a cache view)."""

    @property
    def has_model_work(self) -> bool:
        return bool(self.prefill or self.decode or self.slots_to_flush or self.next_pass)

    @property
    def slot_ids(self) -> list[int]:
        """Every slot the step computes for (prefill or decode)."""
        return [c.slot_id for c in self.prefill] + [r.slot_id for r in self.decode]


@dataclass(frozen=True)
class Sampled:
    """The token a slot sampled this step."""

    slot_id: int
    is_end: bool
    """It is the head's end token (the audio EOS code in any codebook, or the text EOS): the
    runner recorded nothing for it; the scheduler ends the pass."""


@dataclass
class ModelOutput:
    """What one step produced, keyed by slot id."""

    sampled: list[Sampled] = field(default_factory=list)
    """One entry per slot that sampled a token: prefills that completed a prompt, and every
    decode row."""
    audio: dict[int, list[np.ndarray]] = field(default_factory=dict)
    """PCM chunks (float32 mono at the model's rate) that became ready, in order, per slot."""
    flushed: dict[int, FinishedAudio] = field(default_factory=dict)
    """The plan's `slots_to_flush`: each utterance's last audio, text and codes."""
    prepared: dict[int, PreparedPrompt] = field(default_factory=dict)
    """The plan's `next_pass` slots whose audio-code prompt was built."""
    failed: dict[int, RequestFailure] = field(default_factory=dict)
    """Slots whose work failed alone (a non-finite hidden state, a refined text with nothing
    left to say), with the error the request ends with; the step's other slots go on."""


@dataclass(frozen=True)
class FinishedAudio:
    """The end of one slot's utterance, flushed by the runner (`ModelOutput.flushed`)."""

    pcm: np.ndarray
    """The last samples (may be empty)."""
    text: str
    """The text spoken: normalized, and refined if the refine pass ran."""
    codes: np.ndarray
    """(num_tokens, num_vq) int64 audio codes of the utterance (for parity tests and debugging)."""
    spoken: Traced | None = None
    """`text` traced to the request's source."""
    alignment: TokenAlignment | None = None
    """With alignment heads: the text token each audio code attends to."""
