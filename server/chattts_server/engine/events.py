"""What the engine sends back for one utterance, in order: `Spoken` (before the first audio),
`AudioChunk`s, then `UtteranceDone`. Plain Python and numpy, no torch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..text.spans import Traced
from ..timing.types import TokenAlignment


@dataclass(frozen=True)
class Spoken:
    """Sent before an utterance's first audio: the text its audio speaks (normalized, refined
    if the refine pass ran), each character traced to the caller's text (`source`). A door
    that is cut off mid-utterance (barge-in) still knows what was being said."""

    text: Traced


@dataclass
class AudioChunk:
    pcm: np.ndarray
    """(num_samples,) float32 mono at the model's sample rate."""


@dataclass(frozen=True)
class UtteranceDone:
    """The last event of an utterance, with its figures (all measured on the engine thread)."""

    text: str
    """Text actually spoken (after normalization and refinement)."""
    num_tokens: int
    """Audio tokens generated (GPT steps; about 46.9 per second of audio)."""
    num_samples: int
    """PCM samples emitted at the model's rate."""
    time_to_first_audio_s: float
    """Submission to the first audio chunk produced (the whole time if there was none)."""
    generation_time_s: float
    """Submission to the last audio chunk produced."""
    finish_reason: str
    """'eos' (the model ended the sentence) or 'max_tokens' (the token cap cut it)."""
    spoken: Traced | None = None
    """`text` traced to the caller's text, as in `Spoken`."""
    alignment: TokenAlignment | None = None
    """With alignment heads: the text token each audio token attends to (word timing)."""


EngineEvent = Spoken | AudioChunk | UtteranceDone
