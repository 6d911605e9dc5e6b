"""The words ChatTTS speaks in an utterance, each with the span of the caller's text it came from.

    spoken = normalizer.spoken(utterance, chattts_normalizer)   # traced to the stream's text
    spoken_words(spoken)
    # "in 200 m turn": in (0, 2) | two hundred meters (3, 8) | turn (9, 13)
    # "前方500元":     前 (0, 1) | 方 (1, 2) | 五百元 (2, 6)

A word is a run of letters, or one CJK or kana character (Chinese and Japanese are timed
character by character). Control tokens (`[uv_break]`) are pauses, not words. Words that came from
one piece of the caller's text are one word of the result: "two hundred meters" is said for
"200 m", and a caption shows "200 m" while all three are said. So the spans of the result are in
order and never overlap; a word from no caller text (one a rewrite inserted) has the span None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .script import CJK_CHARS
from .spans import KANA, Span, Traced, union

_WORD = re.compile(
    rf"(?P<control>\[[^\[\]\s]{{1,32}}\])|[{CJK_CHARS}{KANA}]|[^\W_{CJK_CHARS}{KANA}]+"
)


@dataclass(frozen=True)
class SpokenWord:
    """One word as spoken, and where it came from."""

    text: str
    """As ChatTTS says it, after normalization: "two hundred meters", "五百元"."""
    span: Span | None
    """[start, end) of the caller's text, in code points; None: from no caller text."""
    start: int
    """Where the word begins in the spoken text (what lies between words holds the pauses)."""
    end: int


def spoken_words(spoken: Traced) -> list[SpokenWord]:
    """The words of `spoken` (the text the engine speaks, traced to the caller's text)."""
    units: list[tuple[int, int, Span | None]] = []  # (start, end, span) in the spoken text
    for m in _WORD.finditer(spoken.text):
        if m.group("control"):
            continue
        start, span = m.start(), spoken.span(m.start(), m.end())
        while span is not None:
            # Merge back to the last word with a span while it reaches into this one's.
            k = next((i for i in range(len(units) - 1, -1, -1) if units[i][2] is not None), -1)
            last = units[k][2] if k >= 0 else None
            if last is None or last[1] <= span[0]:
                break
            start, span = units[k][0], union((last, span))
            del units[k:]
        units.append((start, m.end(), span))
    return [SpokenWord(spoken.text[a:b], span, a, b) for a, b, span in units]
