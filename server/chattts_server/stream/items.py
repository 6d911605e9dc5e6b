"""What a stream's text side hands its speaking side, in order: the items of its timeline.

The text front ends (stream/text_front_end.py: plain text and markdown; stream/ssml_text.py) produce
the same items; the stream (stream/stream.py) answers each in turn on its one timeline of
samples:

    Speak(text)        an utterance: its audio, then its UtteranceEnd (and WordTimings)
    MarkAt(name)       a Mark event at the sample offset where the audio so far ends
    Silence(1.5)       1.5 s of silence written into the audio, counted in the offsets
    SegmentDone(seg)   a SegmentEnd event: how a named segment ended, where its audio ends

A mark always falls between utterances (a mark ends the text before it as a flush does), so its
offset is exact: the samples sent when the speaking side reaches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeAlias

from ..text.spans import Traced
from .segments import Segment

MAX_SILENCE_S = 60.0
"""Longest one Silence item (SSML's <break> asks for far less)."""


@dataclass(frozen=True)
class Speak:
    """One utterance to synthesize."""

    text: Traced
    """`.text` is what the engine reads; `.spans` where each of its characters came from in the
    caller's text (code points of everything sent on the stream)."""
    source: str
    """The caller's text over `text.span()` (markup inside included; "" when no span): the text
    the utterance's and its words' `source_text` are cut from."""
    speed: int | None = None
    """Its `[speed_N]` level when it has its own (SSML `<prosody rate>`); None: the stream's."""
    segment: Segment | None = None
    """The named segment it belongs to (stream/segments.py); None: none."""
    received_at: float | None = None
    """time.monotonic() when its first character reached the server (its lag counts from
    here); None: when it is spoken."""

    @classmethod
    def of(cls, text: Traced, caller_text: str, offset: int = 0) -> Speak:
        """`text` with its source cut from `caller_text`, which starts at `offset` of the
        caller's text."""
        span = text.span()
        source = "" if span is None else caller_text[span[0] - offset : span[1] - offset]
        return cls(text, source)


@dataclass(frozen=True)
class MarkAt:
    """A caller's mark: answered with a Mark event when the speaking side reaches it."""

    name: str
    """1 to 256 characters (`segments.check_name`, checked where it is read)."""
    dropped: bool = False
    """A clear dropped the text before it (set by the reader on clear): the Mark says so."""


@dataclass(frozen=True)
class Silence:
    """Silence of `duration_s` in the audio (SSML <break>): exact, counted in sample offsets."""

    duration_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and 0 <= self.duration_s <= MAX_SILENCE_S):
            raise ValueError(f"silence must be 0 to {MAX_SILENCE_S:g} s, got {self.duration_s}")


@dataclass(frozen=True)
class SegmentDone:
    """The end of a named segment's revision: answered with a SegmentEnd event (its outcome,
    and the offset where its audio ends) when the speaking side reaches it."""

    segment: Segment


StreamItem: TypeAlias = Speak | MarkAt | Silence | SegmentDone
