"""The stream's way into word timing: an utterance's words placed on the stream's timeline
(SynthesisConfig.word_timing), and where its words end (a cut at a word boundary).

The words of the spoken text are placed in the utterance's audio at the model's rate (by its
alignment, `timing/attention.py`, or by the estimate, `timing/estimate.py`); here they move to
the stream's timeline (the chunks' rate, from the utterance's first sample) and get the
caller's own text of their span. A cleared utterance is timed as the whole would have been (its
audio so far, stretched to the duration model's length when shorter) and keeps the words that
begin before the cut, the last one ending at the cut.

With alignment heads (`timing/alignment.py`) a finished utterance carries the model's own
alignment and its words come from it (TIMING_MODEL_ATTENTION); otherwise, and for a cleared
utterance, from the estimate. The server logs which source it serves when it binds the model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..text.duration import estimate_duration_s
from ..text.spans import Span, Traced
from ..text.words import spoken_words
from .attention import attention_timing
from .estimate import estimate_timing
from .types import TokenAlignment, UtteranceTiming


class Utterance(Protocol):
    """An utterance as the stream holds it (`stream/items.Speak`): what the engine reads, traced
    to the caller's text, and the caller's text over its span."""

    @property
    def text(self) -> Traced: ...

    @property
    def source(self) -> str: ...


@dataclass(frozen=True)
class TimedWord:
    """One spoken word on the stream's timeline."""

    text: str
    """As spoken ("two hundred meters")."""
    start_sample: int
    end_sample: int
    start_s: float
    end_s: float
    source_span: Span | None
    """The caller's text it came from, in code points; None: from no caller text."""
    source_text: str
    """The caller's text at `source_span` ("200 m"); "" without one."""


@dataclass(frozen=True)
class WordTimingsOut:
    """The words of one utterance and where they fall in the audio, in order, no overlap."""

    utterance_index: int
    words: tuple[TimedWord, ...]
    source: str
    """How they were obtained: a key of `api/events.TIMING_SOURCES`."""


def own_text(item: Utterance) -> str:
    """The caller's text of an utterance without its markup: the characters of its source that
    some spoken character came from, and the whitespace between them."""
    span = item.text.span()
    if span is None:
        return ""
    covered = [c.isspace() for c in item.source]
    for r in item.text.spans.ranges:
        if r is not None:
            for k in range(r[0] - span[0], r[1] - span[0]):
                covered[k] = True
    return "".join(c for c, keep in zip(item.source, covered, strict=True) if keep)


def word_timings(
    utterance_index: int,
    item: Utterance,
    spoken: Traced,
    pcm: np.ndarray,
    *,
    cut: bool,
    native_rate: int,
    speed: int,
    stream_offset: int,
    stream_samples: int,
    stream_rate: int,
    alignment: TokenAlignment | None = None,
    samples_per_token: int = 0,
) -> WordTimingsOut:
    """The words of `spoken` (what the engine said for `item`) in `pcm` (its audio at
    `native_rate`, up to the cut if `cut`), on the stream's timeline: the utterance's audio is
    samples [stream_offset, stream_offset + stream_samples) at `stream_rate`. With the
    utterance's `alignment` (whole utterances only), by it: each audio token is
    `samples_per_token` native samples."""
    num_native = len(pcm)
    if alignment is not None and not cut:
        timing = attention_timing(spoken_words(spoken), alignment, num_native, samples_per_token)
    elif cut:
        timing = _whole(spoken, num_native, native_rate, speed)
    else:
        words = spoken_words(spoken)
        timing = estimate_timing(
            spoken.text, words, num_native, sample_rate=native_rate, speed=speed, pcm=pcm
        )
    base = item.text.span()
    out: list[TimedWord] = []

    def on_stream(native: int) -> int:
        scaled = round(min(native, num_native) * stream_rate / native_rate)
        return stream_offset + min(stream_samples, scaled)

    for w in timing.words:
        if cut and w.start_sample >= num_native:
            break  # begins after the cut (nothing was heard of it)
        start, end = on_stream(w.start_sample), on_stream(w.end_sample)
        source = ""
        if w.span is not None and base is not None:
            source = item.source[w.span[0] - base[0] : w.span[1] - base[0]]
        out.append(
            TimedWord(w.text, start, end, start / stream_rate, end / stream_rate, w.span, source)
        )
    return WordTimingsOut(utterance_index, tuple(out), timing.source)


def word_ends(spoken: Traced, num_native: int, native_rate: int, speed: int) -> list[int]:
    """Where each word of `spoken` ends in its utterance's audio (native samples), as the
    duration model places them over the whole utterance, taken as at least `num_native` long:
    where a CUT may stop it."""
    whole = _whole_length(spoken, num_native, native_rate, speed)
    return [end for end, _ in _word_ends(spoken, whole, native_rate, speed)]


def heard_until(spoken: Traced, num_native: int, native_rate: int, speed: int) -> int | None:
    """Where the caller's text stands once the first `num_native` samples of an utterance that
    says `spoken` are heard: the end (in the caller's text) of its last word that the duration
    model places wholly in them; never its last word, which only the utterance's end tells.
    None while no such word is heard."""
    whole = _whole_length(spoken, num_native, native_rate, speed)
    end = None
    for word_end, source_end in _word_ends(spoken, whole, native_rate, speed)[:-1]:
        if word_end > num_native:
            break
        if source_end is not None:
            end = source_end
    return end


@functools.lru_cache(maxsize=256)
def _word_ends(
    spoken: Traced, whole: int, native_rate: int, speed: int
) -> tuple[tuple[int, int | None], ...]:
    """Each word's end in an utterance of `whole` samples (`_whole`'s estimate), and its
    source's end: the same for every chunk of an utterance until its audio outgrows the
    duration model's length, so a CUT and `heard_until` ask for it once an utterance."""
    words = spoken_words(spoken)
    timing = estimate_timing(spoken.text, words, whole, sample_rate=native_rate, speed=speed)
    return tuple((w.end_sample, None if w.span is None else w.span[1]) for w in timing.words)


def _whole(spoken: Traced, num_native: int, native_rate: int, speed: int) -> UtteranceTiming:
    """The estimate over the whole utterance (no audio read): `num_native` samples, or the
    duration model's length where that is longer."""
    whole = _whole_length(spoken, num_native, native_rate, speed)
    words = spoken_words(spoken)
    return estimate_timing(spoken.text, words, whole, sample_rate=native_rate, speed=speed)


def _whole_length(spoken: Traced, num_native: int, native_rate: int, speed: int) -> int:
    """An utterance's length as the estimate takes it: its audio so far, or the duration
    model's length where that is longer."""
    return max(num_native, round(estimate_duration_s(spoken.text, speed) * native_rate))
