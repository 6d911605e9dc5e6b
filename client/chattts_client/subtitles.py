"""Captions from a stream's word timings: readable cues, written as WebVTT or SRT.

Cues show the caller's own text ("200 m", not "two hundred meters"), never cross an utterance,
and are cut at about `MAX_CUE_CHARS` characters or `MAX_CUE_S` seconds (the broadcast rule of
thumb: 42 characters a line, at most 7 s on screen), early at a clause's punctuation once
half-full. An utterance without word timing (none asked for, an old server) is one cue.

The two formats are a few lines of text each, so they are written here: the client keeps its
small set of dependencies (it installs beside agent frameworks that pin theirs); the tests read
the files back with webvtt-py, srt and ffmpeg's demuxers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from chattts_client.messages import WordTiming
from chattts_client.timeline import Timeline, Utterance

MAX_CUE_CHARS = 42
MAX_CUE_S = 7.0
SUBTITLE_FORMATS = ("vtt", "srt")

_LINK_TARGET = re.compile(r"\]\([^)]*\)")  # a markdown link's "](url)": not spoken, not shown
_MARKUP = re.compile(r"[*_`#>|~\[\]]")
_CLAUSE_END = re.compile(r"[,.;:!?，。；：！？、…]\s*$")


@dataclass(frozen=True)
class Cue:
    start_s: float
    end_s: float
    text: str


@dataclass(frozen=True)
class _Unit:
    """Consecutive words from one stretch of the caller's text ("200 m" spoken as three)."""

    source_start: int
    source_end: int
    start_s: float
    end_s: float


def _units(words: Sequence[WordTiming]) -> list[_Unit]:
    units: list[_Unit] = []
    for w in words:
        if not w.has_source or w.source_end <= w.source_start:
            continue  # a word from no caller text has nothing to show
        last = units[-1] if units else None
        if last is not None and w.source_start < last.source_end:
            units[-1] = _Unit(
                last.source_start, max(last.source_end, w.source_end), last.start_s, w.end_s
            )
        else:
            units.append(_Unit(w.source_start, w.source_end, w.start_s, w.end_s))
    return units


def _shown(text: str) -> str:
    """The caller's text between words as a viewer should see it: punctuation and spaces, not
    markup (which is in no word's span)."""
    return re.sub(r"\s+", " ", _MARKUP.sub("", _LINK_TARGET.sub("", text)))


class _CueText:
    """The caller's text of a run of units, with the punctuation between and after them."""

    def __init__(self, timeline: Timeline, units: list[_Unit], utterance_end: int) -> None:
        self._source = timeline.source
        self._units = units
        self._utterance_end = utterance_end

    def of(self, first: int, last: int) -> str:
        units = self._units
        parts = []
        for k in range(first, last + 1):
            unit = units[k]
            parts.append(self._source(unit.source_start, unit.source_end))
            if k + 1 < len(units):  # what lies between two words: punctuation, spaces, markup
                parts.append(_shown(self._source(unit.source_end, units[k + 1].source_start)))
            elif self._utterance_end > unit.source_end:
                # After the utterance's last word, its punctuation; not words a clear cut off.
                after = _shown(self._source(unit.source_end, self._utterance_end))
                parts.append(re.split(r"\w", after, maxsplit=1)[0])
        return " ".join("".join(parts).split())


def _utterance_cues(
    timeline: Timeline, utterance: Utterance, max_chars: int, max_duration_s: float
) -> Iterator[Cue]:
    units = _units(utterance.ordered_words())
    end = utterance.end
    utterance_end = end.source_end if end is not None and end.source_end else 0
    text = _CueText(timeline, units, max(utterance_end, units[-1].source_end if units else 0))
    first = 0
    for k in range(1, len(units) + 1):
        current = text.of(first, k - 1)
        if k < len(units):
            longer = text.of(first, k)
            too_long = (
                len(longer) > max_chars or units[k].end_s - units[first].start_s > max_duration_s
            )
            clause_done = len(current) >= max_chars // 2 and _CLAUSE_END.search(current)
            if not (too_long or clause_done):
                continue
        if current:
            yield Cue(units[first].start_s, units[k - 1].end_s, current)
        first = k


def cues(
    timeline: Timeline, max_chars: int = MAX_CUE_CHARS, max_duration_s: float = MAX_CUE_S
) -> list[Cue]:
    """The captions of everything the timeline holds, in order."""
    out: list[Cue] = []
    clock_s = 0.0  # where an utterance with no offsets (an old server) starts
    rate = timeline.sample_rate_hz
    for utterance in timeline.ordered_utterances():
        if utterance.words:
            out.extend(_utterance_cues(timeline, utterance, max_chars, max_duration_s))
        elif utterance.end is not None:
            end = utterance.end
            start_s = end.sample_offset / rate if end.num_samples else clock_s
            duration_s = end.num_samples / rate if end.num_samples else end.audio_duration_s
            text = _shown(end.source_text or end.text)
            if text and duration_s > 0:
                out.append(Cue(start_s, start_s + duration_s, text))
        if out:
            clock_s = max(clock_s, out[-1].end_s)
    return out


# --- files ----------------------------------------------------------------------------------


def _timestamp(seconds: float, decimal: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def _timed(cue_list: Sequence[Cue]) -> Iterator[tuple[float, float, str]]:
    """Cues with text on one line and an end after the start (both formats need one)."""
    for cue in cue_list:
        text = " ".join(cue.text.split())
        if text:
            yield cue.start_s, max(cue.end_s, cue.start_s + 0.001), text


def to_webvtt(cue_list: Sequence[Cue]) -> str:
    """A WebVTT file: the header, then each cue and a blank line."""
    blocks = ["WEBVTT"]
    for start_s, end_s, text in _timed(cue_list):
        escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        blocks.append(f"{_timestamp(start_s, '.')} --> {_timestamp(end_s, '.')}\n{escaped}")
    return "".join(block + "\n\n" for block in blocks)


def to_srt(cue_list: Sequence[Cue]) -> str:
    """An SRT file: each cue numbered from 1, and a blank line."""
    return "".join(
        f"{number}\n{_timestamp(start_s, ',')} --> {_timestamp(end_s, ',')}\n{text}\n\n"
        for number, (start_s, end_s, text) in enumerate(_timed(cue_list), 1)
    )


def subtitle_format(path: str | os.PathLike[str]) -> str:
    """ "vtt" or "srt", from the file name's extension; ValueError for any other."""
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if ext not in SUBTITLE_FORMATS:
        raise ValueError(f"subtitles: {os.fspath(path)!r} must end in .vtt (WebVTT) or .srt (SRT)")
    return ext


def write_subtitles(path: str | os.PathLike[str], cue_list: Sequence[Cue]) -> None:
    """Write cues to `path` as WebVTT (.vtt) or SRT (.srt), UTF-8."""
    text = to_webvtt(cue_list) if subtitle_format(path) == "vtt" else to_srt(cue_list)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
