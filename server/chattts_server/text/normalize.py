"""Spell out text for ChatTTS, whose tokenizer would drop every digit and most symbols.

    normalizer = TextNormalizer()
    normalizer("Turn left in 200m onto the M25.")   # 'Turn left in two hundred meters onto the M twenty five.'
    normalizer("前方200米右转，限速60km/h")            # '前方两百米右转，限速六十公里每小时'

The work is done by WeTextProcessing's TN grammars (the `wetext` runtime: compiled FSTs shipped
inside the wheel, read with kaldifst; nothing is downloaded) for zh and en, with our rules in
front for what those grammars get wrong in navigation and caption text (rules_en, rules_zh),
links, addresses and file names read as people say them before them (readable), and a last
pass that leaves only characters ChatTTS can say (symbols).
Language: any CJK character makes the text Chinese. Allowed control tokens pass untouched;
forbidden ones are dropped (the API rejects them first). A final pass spells out any digit
left, so no ASCII digit ever reaches ChatTTS.

`traced` gives the same text traced to its input (text/spans.py): our own rules trace exactly,
each replacement to the span it replaced ("two hundred meters" to "200 m"), the library pass by
aligning its output with its input word by word.

Cost on one 2-core machine: importing wetext ~0.5 s, then ~1 ms for a short sentence and
~10 ms for a 150-character one. Not thread-safe; the engine thread owns one instance.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from . import control_tokens, rules_en, rules_zh
from .readable import readable_traced
from .script import Language, language
from .spans import Traced
from .symbols import speakable_traced, without_pictographs_traced

log = logging.getLogger(__name__)

_SPACES = re.compile(r"\s+")
_ANY_DIGIT = re.compile(r"\d")
_HAS_WORD = re.compile(r"\w")


# Full-width digits and letters (not the full-width punctuation Chinese text is written with).
_FULL_WIDTH = {
    c: c - 0xFEE0
    for r in ((0xFF10, 0xFF19), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A))
    for c in range(r[0], r[1] + 1)
}


def _ascii_char(c: str) -> str:
    """A full-width digit or letter, or another Unicode decimal digit, in ASCII, so the rules
    see it; a NUL dropped."""
    if c == "\x00":
        return ""
    c = c.translate(_FULL_WIDTH)
    return str(unicodedata.decimal(c)) if c.isdecimal() and not c.isascii() else c


_CJK_JOIN_SPACE = re.compile(r"(?<=[^\x00-\x7f]) (?=[^\x00-\x7f\[])")


class TextNormalizer:
    """Text in, the same text with numbers, units and symbols spelled out in words."""

    def __init__(self) -> None:
        self._library: dict[Language, Any] = {}

    def __call__(self, text: str, lang: Language | None = None) -> str:
        return self.traced(Traced.source(text), lang).text

    def traced(self, text: Traced, lang: Language | None = None) -> Traced:
        """`self(text.text)`, each character traced to the characters of `text` it came from
        (and so on to wherever `text` came from)."""
        if not text.text.isascii() or "\x00" in text.text:
            text = text.map_chars(_ascii_char)
        lang = lang or language(text.text)
        out = []
        for start, end, is_control in control_tokens.control_pieces(text.text):
            piece = text[start:end]
            out.append(piece if is_control else self._text(piece, lang))
        joined = Traced.join(" ", (p.strip() for p in out if p.text.strip()))
        if lang == "zh":
            # Spaces between CJK characters are an artefact of joining, not pauses.
            joined = joined.sub(_CJK_JOIN_SPACE, "")
        return joined

    def spoken(self, text: Traced, chattts_normalizer: Callable[..., str]) -> Traced:
        """What ChatTTS reads for `text`: spelled out here, then through ChatTTS's own
        normalizer (`Chat.normalizer`: its alphabet, homophones), traced to `text`'s spans."""
        spelled = self.traced(text)
        lang = language(spelled.text)
        return spelled.rewrite(str(chattts_normalizer(spelled.text, True, True, lang)))

    def warm_up(self) -> None:
        """Load both grammars now rather than on a first request."""
        self("Turn left in 200 m at 10:30.", "en")
        self("前方200米右转，票价4.50元。", "zh")

    def _text(self, text: Traced, lang: Language) -> Traced:
        # Brackets that are not control tokens would reach the tokenizer as tags.
        text = text.map_chars(lambda c: " " if c in "[]" else c)
        if not _HAS_WORD.search(text.text):
            return speakable_traced(text.sub(_SPACES, " "), lang)
        rules = rules_zh if lang == "zh" else rules_en
        text = readable_traced(without_pictographs_traced(text), lang).sub(_SPACES, " ")
        text = rules.before_library(text)
        text = text.rewrite(self._library_pass(text.text, lang))
        if lang == "en":
            text = rules_en.after_library(text)
        text = rules.spell_digits(text)
        return speakable_traced(text.sub(_SPACES, " ").strip(), lang)

    def _library_pass(self, text: str, lang: Language) -> str:
        library = self._library.get(lang)
        if library is None:
            from wetext import Normalizer

            library = self._library[lang] = Normalizer(lang=lang, operator="tn")
        try:
            # Not normalize_with_mapping: it is several times slower and reads some numbers
            # differently ("12.5" as "twelve and a half"); `Traced.rewrite` aligns instead.
            return str(library.normalize(text))
        except Exception as exc:  # a grammar that finds no path raises; our rules still ran
            log.debug("wetext could not normalize %r: %r", text[:80], exc)
            return text
