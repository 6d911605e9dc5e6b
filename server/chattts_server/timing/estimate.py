"""Word timing estimated from an utterance's audio, where the model gives none.

The utterance's real length is shared out among its words by the duration model that already
cuts long sentences (`duration.estimate_duration_s`: letters and CJK characters at ChatTTS's
rate, a pause per stop and break token), then each boundary between two words is moved to a
pause found in the audio nearby: a run of quiet frames, where the word before ends and the next
begins, or else the quietest frame close to the estimate. Leading and trailing silence belong to
no word. Left to right, each boundary found re-shares what is left, so an early mistake does not
carry to the end of a long utterance.

    timing = estimate_timing(spoken.text, spoken_words(spoken), len(pcm),
                             sample_rate=info.sample_rate, speed=5, pcm=pcm)
    timing.source  # "estimate"
    timing.words   # WordTiming(text, span, start_sample, end_sample), relative to the utterance

Pure numpy, no model: it runs where the utterance's audio is known (its end).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..text.duration import estimate_duration_s
from ..text.words import SpokenWord
from .types import ESTIMATE, UtteranceTiming, WordTiming

FRAME_S = 0.01
"""Length of one energy frame."""
SILENCE_DB = -30.0
"""A frame this far below the loud frames (their 95th percentile) is quiet."""
MIN_PAUSE_S = 0.03
"""Quiet frames in a row that make a pause between words (shorter ones are stop closures)."""
MIN_WORD_S = 0.04
"""Shortest estimate of a word, and the least a snapped boundary leaves each word."""
VALLEY_SHARE = 0.25
"""Without a pause, a boundary moves to the quietest frame within this share of its words."""


def estimate_timing(
    spoken_text: str,
    words: Sequence[SpokenWord],
    num_samples: int,
    *,
    sample_rate: int,
    speed: int = 5,
    pcm: np.ndarray | None = None,
) -> UtteranceTiming:
    """Each of `words` (of `spoken_text`, from `words.spoken_words`) placed in an utterance of
    `num_samples` samples at `sample_rate`, spoken at `[speed_N]` `speed`; with its PCM (float,
    `num_samples` long) boundaries snap to the pauses in it."""
    if pcm is not None and len(pcm) != num_samples:
        raise ValueError(f"pcm holds {len(pcm)} samples, not {num_samples}")
    if not words:
        return UtteranceTiming(ESTIMATE, ())
    word_s = [max(estimate_duration_s(w.text, speed), MIN_WORD_S) for w in words]
    ends = [0, *(w.end for w in words)]
    starts = [*(w.start for w in words), len(spoken_text)]
    gap_s = [
        estimate_duration_s(spoken_text[a:b], speed) for a, b in zip(ends, starts, strict=True)
    ]
    frames = _Frames(pcm, sample_rate) if pcm is not None else None
    if frames is None or frames.quiet is None:
        bounds = _shared(word_s, gap_s, 0.0, float(num_samples), with_ends=True)
    else:
        bounds = _snapped(word_s, gap_s, frames, num_samples, sample_rate)
    return UtteranceTiming(ESTIMATE, tuple(_timings(words, bounds, num_samples)))


class _Frames:
    """The PCM's energy in frames of `FRAME_S`, and which frames are quiet."""

    def __init__(self, pcm: np.ndarray, sample_rate: int) -> None:
        self.size = max(1, round(sample_rate * FRAME_S))
        num_frames = len(pcm) // self.size
        frames = np.asarray(pcm[: num_frames * self.size], dtype=np.float64)
        self.rms = np.sqrt(np.mean(frames.reshape(num_frames, self.size) ** 2, axis=1))
        self.quiet: np.ndarray | None = None
        if num_frames:
            loud = float(np.percentile(self.rms, 95))
            if loud > 0:
                self.quiet = self.rms < loud * 10 ** (SILENCE_DB / 20)

    def pauses(self, lo: float, hi: float, min_frames: int) -> list[tuple[float, float]]:
        """Runs of quiet frames at least `min_frames` long that reach into [lo, hi], whole (a
        pause found near the estimate ends where it ends), in samples."""
        assert self.quiet is not None
        quiet = self.quiet
        runs: list[tuple[float, float]] = []
        f = max(0, int(lo // self.size))
        last = min(len(quiet), int(np.ceil(hi / self.size)))
        while f < last:
            if not quiet[f]:
                f += 1
                continue
            start = f
            while start > 0 and quiet[start - 1]:
                start -= 1
            end = f
            while end < len(quiet) and quiet[end]:
                end += 1
            if end - start >= min_frames:
                runs.append((float(start * self.size), float(end * self.size)))
            f = end
        return runs

    def quietest(self, lo: float, hi: float) -> float | None:
        """The middle of the quietest frame wholly inside [lo, hi], in samples."""
        first, last = int(np.ceil(lo / self.size)), min(len(self.rms), int(hi // self.size))
        if last <= first:
            return None
        return (first + int(np.argmin(self.rms[first:last])) + 0.5) * self.size


def _shared(
    word_s: Sequence[float], gap_s: Sequence[float], lo: float, hi: float, with_ends: bool
) -> list[tuple[float, float]]:
    """(start, end) of each word sharing [lo, hi] by the estimates; the pauses before the first
    and after the last word are in it only `with_ends`."""
    inner = list(gap_s[1:-1])
    before, after = (gap_s[0], gap_s[-1]) if with_ends else (0.0, 0.0)
    total = before + sum(word_s) + sum(inner) + after
    scale = (hi - lo) / total if total > 0 else 0.0
    at = lo + before * scale
    bounds = []
    for i, seconds in enumerate(word_s):
        if i:
            at += inner[i - 1] * scale
        bounds.append((at, at + seconds * scale))
        at += seconds * scale
    return bounds


def _snapped(
    word_s: Sequence[float],
    gap_s: Sequence[float],
    frames: _Frames,
    num_samples: int,
    sample_rate: int,
) -> list[tuple[float, float]]:
    assert frames.quiet is not None
    loud = np.flatnonzero(~frames.quiet)
    if not len(loud):
        return _shared(word_s, gap_s, 0.0, float(num_samples), with_ends=True)
    # Speech runs from the first loud frame to the end of the last one.
    lead = float(loud[0] * frames.size)
    tail = float(min(num_samples, (loud[-1] + 1) * frames.size))
    n = len(word_s)
    min_word = min(MIN_WORD_S * sample_rate, (tail - lead) / (2 * n))
    min_pause = max(1, round(MIN_PAUSE_S / FRAME_S))
    bounds: list[tuple[float, float]] = []
    start = lead
    for i in range(n - 1):
        # What is left, shared anew from this word's start.
        shared = _shared(word_s[i:], [0.0, *gap_s[i + 1 :]], start, tail, with_ends=False)
        (_, end), (next_start, next_end) = shared[:2]
        # Each word keeps its least; the words after this one keep theirs.
        floor, ceiling = start + min_word, tail - min_word * (n - 1 - i)
        # The boundary may move by half a word either way.
        lo = max(floor, start + (end - start) / 2)
        hi = min(ceiling, next_start + (next_end - next_start) / 2)
        mid = (end + next_start) / 2
        pauses = frames.pauses(lo, hi, min_pause) if lo < hi else []
        if pauses:
            a, b = min(pauses, key=lambda p: abs((p[0] + p[1]) / 2 - mid))
            end, next_start = max(a, floor), min(b, ceiling)
        elif lo < hi:
            reach = VALLEY_SHARE * min(end - start, next_end - next_start)
            valley = frames.quietest(max(lo, mid - reach), min(hi, mid + reach))
            if valley is not None:
                half_gap = min((next_start - end) / 2, valley - lo, hi - valley)
                end, next_start = valley - half_gap, valley + half_gap
        bounds.append((start, max(start, end)))
        start = max(start, next_start)
    bounds.append((start, max(start, tail)))
    return bounds


def _timings(
    words: Sequence[SpokenWord], bounds: Sequence[tuple[float, float]], num_samples: int
) -> list[WordTiming]:
    """Whole samples, in order, without overlap, inside [0, num_samples]."""
    out: list[WordTiming] = []
    at = 0
    for word, (start, end) in zip(words, bounds, strict=True):
        first = min(num_samples, max(at, round(start)))
        last = min(num_samples, max(first, round(end)))
        out.append(WordTiming(word.text, word.span, first, last))
        at = last
    return out
