"""SSML attribute values as ChatTTS can use them: break lengths, speaking rates, languages.

Each reader returns the value or raises ValueError saying what is wrong; the element table
(`elements.py`) adds the line, column and element.
"""

from __future__ import annotations

import re

from ..script import Language

MAX_BREAK_S = 10.0
"""Longest `<break time>` (Google's limit; Azure's is 5 s)."""
# fmt: off
BREAK_STRENGTH_S = {
    "none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0, "x-strong": 1.25,
}
# fmt: on
"""`<break strength>` in seconds (Azure's table: W3C gives no figures); a bare `<break/>` is medium."""

_TIME = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*")


def break_seconds(time: str | None, strength: str | None) -> float:
    """A `<break>`'s length: `time` ("500ms", "1.5s") wins over `strength`."""
    if time is not None:
        m = _TIME.fullmatch(time)
        if m is None:
            raise ValueError(f'time="{time[:32]}" is not a duration such as "500ms" or "1.5s"')
        seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        if seconds > MAX_BREAK_S:
            raise ValueError(f'time="{time}" is longer than {MAX_BREAK_S:g} s')
        return seconds
    if strength is None:
        return BREAK_STRENGTH_S["medium"]
    if strength not in BREAK_STRENGTH_S:
        raise ValueError(f'strength="{strength[:32]}" is not one of {", ".join(BREAK_STRENGTH_S)}')
    return BREAK_STRENGTH_S[strength]


SPEED_LEVELS = (0, 9)
"""ChatTTS's `[speed_N]` levels."""
LEVELS_PER_RATE = 10.0
"""Speed levels per unit of rate: one level is about 10% of the speaking rate around `[speed_5]`
(text/duration.py's estimate uses the same share)."""
RATE_LABELS = {"x-slow": 1, "slow": 3, "medium": 5, "default": 5, "fast": 7, "x-fast": 9}
"""`<prosody rate>` labels as speed levels (absolute, whatever the stream's speed)."""

_RELATIVE = re.compile(r"\s*([+-])\s*(\d+(?:\.\d+)?)\s*%\s*")
_PERCENT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*%\s*")
_FACTOR = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")


def rate_level(rate: str, enclosing: float) -> float:
    """A `<prosody rate>` as a speed level (unrounded) inside an element at level `enclosing`:
    a label is absolute; "80%" and "0.8" scale the enclosing rate, "+20%" and "-10%" change it."""
    value = rate.strip()
    if value in RATE_LABELS:
        return float(RATE_LABELS[value])
    if m := _RELATIVE.fullmatch(value):
        change = float(m.group(2)) / 100 * (1 if m.group(1) == "+" else -1)
    elif m := _PERCENT.fullmatch(value):
        change = float(m.group(1)) / 100 - 1
    elif m := _FACTOR.fullmatch(value):
        change = float(m.group(1)) - 1
    else:
        labels = ", ".join(RATE_LABELS)
        raise ValueError(
            f'rate="{rate[:32]}" is not one of {labels}, a percentage ("80%", "+20%") or a factor ("1.2")'
        )
    return enclosing + change * LEVELS_PER_RATE


def speed_level(level: float) -> int:
    low, high = SPEED_LEVELS
    return max(low, min(high, round(level)))


def language_hint(tag: str) -> Language | None:
    """'en-US' -> 'en', 'zh-CN' / 'cmn-Hans-CN' / 'yue-HK' -> 'zh'; others: None (no hint)."""
    primary = tag.strip().lower().replace("_", "-").split("-")[0]
    if primary == "en":
        return "en"
    if primary in ("zh", "cmn", "yue"):
        return "zh"
    return None
