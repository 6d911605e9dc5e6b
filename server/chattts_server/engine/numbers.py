"""Spell out numbers before ChatTTS sees them.

ChatTTS's Normalizer drops every character its tokenizer has no entry for, digits included,
unless a text normalizer is registered for the language (upstream suggests NeMo or
WeTextProcessing, heavy dependencies). "Turn left in 200 meters" would lose its distance, which is
the point of a navigation prompt. These two small normalizers cover numbers: num2words for
English, cn2an for Chinese.
"""

from __future__ import annotations

import re
from typing import Any

_EN_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?(?P<ord>st|nd|rd|th)?(?P<pct>%)?(?![\w])"
)


def _english_number(m: re.Match[str]) -> str:
    from num2words import num2words

    whole = m.group("num").replace(",", "")
    if m.group("ord") and not m.group("frac"):
        words = num2words(int(whole), to="ordinal")
    elif m.group("frac"):
        # Digit by digit after the point, as people read decimals ("three point one four").
        digits = " ".join(num2words(int(d)) for d in m.group("frac")[1:])
        words = f"{num2words(int(whole))} point {digits}"
    else:
        words = num2words(int(whole))
    if m.group("pct"):
        words += " percent"
    return str(words).replace("-", " ").replace(",", "")


def english_numbers(text: str) -> str:
    """'Turn left in 200 m, then 1.5 km; 21st exit, 30%' -> words."""
    return _EN_NUMBER.sub(_english_number, text)


def chinese_numbers(text: str) -> str:
    """'前方200米右转' -> '前方二百米右转' (cn2an, which also reads dates, percents and decimals)."""
    import cn2an

    return str(cn2an.transform(text, "an2cn"))


def register_number_normalizers(normalizer: Any) -> None:
    """Register both on a ChatTTS `Normalizer` (languages 'en' and 'zh')."""
    normalizer.register("en", english_numbers)
    normalizer.register("zh", chinese_numbers)
