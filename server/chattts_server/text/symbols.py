"""The last pass before ChatTTS: only characters it can say, and the breaks the others marked.

ChatTTS's normalizer keeps CJK ideographs, Latin letters, spaces and `， 。 、 , .`; anything
else it drops with a WARNING per utterance ("found invalid characters"), and with it the pause a
`?` or `;` marked. This pass runs after the numbers and units are spelled out and maps each
remaining character to what ChatTTS can say: a sentence end (`! ? ; …` to `.` or `。`), a clause
break (`: ( ) —` and the like to `,` or `，`), a space (a hyphen or slash inside a word), or
nothing (quotes, emoji, stray markup), with accents folded (`café` to `cafe`). What it changed is
logged at debug level only.
"""

from __future__ import annotations

import logging
import re
import unicodedata

from .script import CJK_CHARS, Language
from .spans import Traced

log = logging.getLogger(__name__)

_ALLOWED = re.compile(rf"[^{CJK_CHARS}A-Za-z ,.，。、]")
_SENTENCE = {"en": ". ", "zh": "。"}
_CLAUSE = {"en": ", ", "zh": "，"}
_ENDS = set("!?;…！？；‼⁉")
_BREAKS = set(":()[]{}<>|—–：（）【】〔〕《》〈〉「」『』·•")
_SPACE = set("-/_\\~^*+=#&@$%`\t\n")
_INSIDE_WORD = re.compile(r"(?<=[A-Za-z])[-/'’](?=[A-Za-z])")
_RUNS = {
    "en": (
        (re.compile(r"\s*([,.])(?:\s*[,.])*"), None),  # ", ." -> the strongest
        (re.compile(r"^[\s,.]+"), ""),
        (re.compile(r" {2,}"), " "),
    ),
    "zh": (
        (re.compile(r"\s*([，。、,.])(?:\s*[，。、,.])*\s*"), None),
        (re.compile(r"^[\s，。、,.]+"), ""),
        (re.compile(r" {2,}"), " "),
    ),
}


def _strongest(m: re.Match[str], lang: Language) -> str:
    marks = re.sub(r"\s", "", m.group())
    if "." in marks or "。" in marks:
        return _SENTENCE[lang]
    return "、" if marks == "、" else _CLAUSE[lang]


def without_pictographs_traced(text: Traced) -> Traced:
    if text.text.isascii():
        return text
    return text.map_chars(_without_pictograph)


def _without_pictograph(c: str) -> str:
    if c in "\u200d\ufe0f\ufe0e" or "\U0001f3fb" <= c <= "\U0001f3ff":
        return ""
    return " " if unicodedata.category(c) == "So" and c >= "\u2190" else c


def speakable(text: str, lang: Language) -> str:
    """text in ChatTTS's alphabet, its sentence and clause breaks kept (see module docstring)."""
    return speakable_traced(Traced.source(text), lang).text


def speakable_traced(text: Traced, lang: Language) -> Traced:
    """`speakable`, each character traced to the one it replaced."""
    original = text.text
    # Wi-Fi, and/or, it's: inside a word, a space (or nothing for an apostrophe).
    text = text.sub(_INSIDE_WORD, lambda m: "" if m.group() in "'’" else " ")
    text = text.map_chars(lambda c: _speakable_char(c, lang))
    for pattern, repl in _RUNS[lang]:
        if repl is None:
            text = text.sub(pattern, lambda m: _strongest(m, lang))
        else:
            text = text.sub(pattern, repl)
    text = text.strip()
    if text.text != original:
        log.debug("speakable: %r -> %r", original[:80], text.text[:80])
    return text


def _speakable_char(c: str, lang: Language) -> str:
    if not _ALLOWED.match(c):
        return c
    if c in _ENDS:
        return _SENTENCE[lang]
    if c in _BREAKS:
        return _CLAUSE[lang]
    if c in _SPACE or c.isspace():
        return " "
    folded = unicodedata.normalize("NFKD", c).encode("ascii", "ignore").decode()
    return folded if folded.isalpha() else ""
