"""A pass: one GPT run over one prompt for one request, and the state the runner keeps for it.

An utterance has one pass (audio codes) or two (ChatTTS's refine-text pass, then audio codes on
the same slot). `ModelRunner.prepare` creates a request's first `PassState` and hands it to the
scheduler inside the `PreparedPrompt`; the scheduler gives it back with the slot (`NewSlot`),
and the runner holds it by slot id until the utterance is flushed or its slot released.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

import torch

from ..text.spans import Traced
from ..timing.types import PromptText
from .decode_stream import DecodeStream
from .step_io import PreparedPrompt
from .utterance import REFINE_SAMPLING, SamplingParams, UtteranceRequest


class Phase(enum.Enum):
    REFINE = "refine"
    """ChatTTS's refine-text pass: the text head rewrites the sentence with prosody tags."""
    CODES = "codes"
    """Audio codes: the audio heads, with every hidden state streamed to the Decoder."""


def pass_sampling(params: UtteranceRequest, phase: Phase) -> SamplingParams:
    """How a pass samples. The audio pass speaks at least one token: never a silent sentence
    (upstream regenerates instead); the refine pass keeps only the request's seed."""
    if phase is Phase.REFINE:
        return replace(REFINE_SAMPLING, seed=params.sampling.seed)
    return replace(params.sampling, min_new_tokens=max(1, params.sampling.min_new_tokens))


@dataclass
class PassState:
    """What the request in one slot (or waiting for one) asks and has made: the runner's
    share of a request (the scheduler keeps its slot, counters and budget)."""

    params: UtteranceRequest
    phase: Phase
    prompt: torch.Tensor
    """(L, D) prompt embeddings of the current pass, in the GPT dtype."""
    spoken: Traced
    """The text the pass reads (normalized; after refine, refined), traced to the caller's."""
    sampling: SamplingParams
    """The current pass's sampling (`pass_sampling`)."""
    next_embed: torch.Tensor | None = None
    """(D,) input embedding of the next decode step (the last sampled token)."""
    text_tokens: list[int] = field(default_factory=list)
    """Refine pass: text token ids sampled so far."""
    stream: DecodeStream | None = None
    """Audio-code pass: the streaming decoder's state."""
    codes: list[list[int]] = field(default_factory=list)
    """Audio codes generated so far (num_vq each)."""
    prompt_text: PromptText | None = None
    """Audio-code pass: where its text lies in the prompt (for the alignment heads)."""
    alignment: list[int] = field(default_factory=list)
    """With alignment heads: per decode step of the audio pass, the text token attended to
    (`timing.alignment.utterance_alignment` makes the utterance's alignment of them)."""

    def prepared(self) -> PreparedPrompt:
        """The current pass as the scheduler budgets it (the state rides along, opaque)."""
        final = self.phase is Phase.CODES
        s = self.sampling
        spoken = self.spoken if final else None
        return PreparedPrompt(
            int(self.prompt.shape[0]), s.max_new_tokens, s.min_new_tokens, final, spoken, self
        )
