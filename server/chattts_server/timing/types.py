"""What word timing's parts share, and what the engine and the stream hold of it: plain
Python, no torch (the stream side imports it)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeAlias

from ..text.spans import Span

ESTIMATE = "estimate"
"""`UtteranceTiming.source` of the duration model's timing (`timing/estimate.py`)."""
ATTENTION = "attention"
"""`UtteranceTiming.source` of the model's own alignment (`timing/attention.py`); tts.proto
calls it TIMING_MODEL_ATTENTION."""

HeadId: TypeAlias = tuple[int, int]
"""(layer, head)."""


@dataclass(frozen=True)
class CaptureRow:
    """One row of a forward whose weights over its slot's text positions are wanted."""

    row: int
    """Its index among the forward's rows (for `LlamaDecoder.forward_batch`: among the decode
    batch's rows)."""
    slot_id: int
    text_start: int
    """Prompt positions [text_start, text_end) of the slot hold the text tokens."""
    text_end: int


CaptureRequest: TypeAlias = tuple[tuple[HeadId, ...], list[CaptureRow]]
"""What a forward is asked to capture: the alignment heads' weights, for these rows."""


@dataclass(frozen=True)
class PromptText:
    """Where the spoken text's tokens lie in an audio-code prompt (for the alignment heads)."""

    start: int
    """Prompt position of the first text token; the others follow it."""
    token_chars: tuple[tuple[int, int], ...]
    """Per text token, its [start, end) in the prompt's text."""

    @property
    def positions(self) -> tuple[int, int]:
        return self.start, self.start + len(self.token_chars)


@dataclass(frozen=True)
class TokenAlignment:
    """One utterance's alignment: which text token each of its audio tokens attends to."""

    path: tuple[int, ...]
    """Per audio token (in order), the index of a text token of `token_chars`."""
    token_chars: tuple[tuple[int, int], ...]
    """Per text token of the prompt, its [start, end) in the spoken text."""


@dataclass(frozen=True)
class WordTiming:
    """One spoken word in the audio."""

    text: str
    """As spoken ("two hundred meters")."""
    span: Span | None
    """[start, end) of the caller's text, in code points; None: from no caller text."""
    start_sample: int
    """First sample of the word, from the utterance's first sample (`shifted` for the stream)."""
    end_sample: int
    """One past its last sample; the next word starts at or after it."""

    def shifted(self, num_samples: int) -> WordTiming:
        """The same timing `num_samples` later (on the stream's timeline)."""
        return replace(
            self,
            start_sample=self.start_sample + num_samples,
            end_sample=self.end_sample + num_samples,
        )


@dataclass(frozen=True)
class UtteranceTiming:
    source: str
    """How the timing was obtained: `ESTIMATE` or `ATTENTION`."""
    words: tuple[WordTiming, ...]
    """In order, without overlap, inside the utterance's audio."""
