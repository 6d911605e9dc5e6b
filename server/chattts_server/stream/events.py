"""What a stream sends, as domain events (their wire forms: api/events.py).

Every event sits on the stream's one timeline of samples (at the chunks' `sample_rate_hz`):
audio chunks are contiguous from 0, an utterance's end says where its audio lies, a mark where
the audio before it ends, a word timing where each word lies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from ..engine.events import UtteranceDone
from ..text.spans import Span
from ..timing.timeline import WordTimingsOut
from .segments import Outcome


@dataclass(frozen=True)
class AudioOut:
    """Encoded audio of one utterance, at a position in the stream."""

    data: bytes
    sample_offset: int
    """Samples (at `sample_rate_hz`) the stream sent before this chunk."""
    num_samples: int
    utterance_index: int
    sample_rate_hz: int
    encoding: str
    silence: bool = False
    """Silence the stream asked for (`stream_items.Silence`), not speech: no first audio."""
    heard_source_end: int = 0
    """Where the caller's text stands once this chunk is heard (`StreamOutput.heard`)."""


@dataclass(frozen=True)
class UtteranceEnded:
    """An utterance is complete: all its audio has been sent."""

    utterance_index: int
    done: UtteranceDone
    audio_duration_s: float
    sample_offset: int = 0
    """Stream offset of its first sample."""
    num_samples: int = 0
    """Its samples that were sent (a cleared one: up to the cut)."""
    source_text: str = ""
    """The caller's own text of it, markup excluded."""
    source_span: Span | None = None
    """Where `source_text` lies in the caller's text, in code points; None: from no text."""
    lag_s: float = 0.0
    """From its first text reaching the server to its first audio being heard in real time."""
    speed: int = 0
    """The speed level it was spoken at."""


@dataclass(frozen=True)
class MarkReached:
    """The answer to a caller's mark: where the audio of the text before it ends."""

    name: str
    sample_offset: int
    offset_s: float
    dropped: bool = False
    """A clear dropped the text before it; the offset is the cut."""


@dataclass(frozen=True)
class SegmentEnded:
    """The one answer to a named segment's revision: how it ended, where its audio ends."""

    name: str
    revision: int
    outcome: Outcome
    sample_offset: int
    offset_s: float
    text: str
    """The caller's text of the revision."""


SessionEvent: TypeAlias = AudioOut | UtteranceEnded | MarkReached | WordTimingsOut | SegmentEnded
