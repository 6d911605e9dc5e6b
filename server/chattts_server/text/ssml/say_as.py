"""`<say-as interpret-as>`: the element's text read as the caller says it is, in words.

The number words come from the text normalizer's own rules (text/rules_en.py, rules_zh.py:
cardinals, decimals, digit runs; their unit, clock and phone rules for `unit`, `time`,
`telephone`), so a say-as reads as the same thing written plainly would where the normalizer
guesses right. A text the class cannot read (`cardinal` of "abc") is spoken as written, as
W3C leaves it to the processor. The engine's normalizer then sees only words.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

from .. import rules_en, rules_zh
from ..script import CJK, Language
from ..spans import Traced

_NUMBER = re.compile(r"\s*(?P<sign>[-−+])?\s*(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+)\s*")
_ORDINAL = re.compile(r"\s*(?P<num>\d{1,3}(?:,\d{3})*|\d+)\s*(?:st|nd|rd|th|\.|第)?\s*", re.I)
_FRACTION = re.compile(r"\s*(?:(?P<whole>\d+)\s+)?(?P<num>\d+)\s*/\s*(?P<den>\d+)\s*")
_DATE_PARTS = re.compile(r"\d+")
# fmt: off
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
# fmt: on


def _cardinal(text: str, lang: Language) -> str | None:
    m = _NUMBER.fullmatch(text)
    if m is None:
        return None
    number = m.group("num").replace(",", "")
    rules = rules_zh if lang == "zh" else rules_en
    words = rules.decimal(number) if "." in number else rules.cardinal(number)
    if m.group("sign") in ("-", "−"):
        words = ("负" if lang == "zh" else "minus ") + words
    return words


def ordinal_words(value: int) -> str:
    """21 -> 'twenty first' (no hyphens: ChatTTS reads a hyphen as a pause)."""
    return str(num2words(value, to="ordinal")).replace("-", " ").replace(",", "")


def _ordinal(text: str, lang: Language) -> str | None:
    m = _ORDINAL.fullmatch(text)
    if m is None:
        return None
    value = int(m.group("num").replace(",", ""))
    return f"第{rules_zh.cardinal(value)}" if lang == "zh" else ordinal_words(value)


def _digits(text: str, lang: Language) -> str | None:
    if not any(c.isdigit() for c in text):
        return None
    return rules_zh.digits(text) if lang == "zh" else rules_en.digits(text)


def _characters(text: str, lang: Language) -> str | None:
    """Each letter and digit on its own: '12B' -> 'one two B'."""
    out = []
    for c in text:
        if c.isdigit() and c.isascii():
            out.append(rules_zh.digits(c) if lang == "zh" else rules_en.digits(c))
        elif c.isalpha():
            out.append(c if CJK.match(c) else c.upper())
    return ("" if lang == "zh" else " ").join(out) or None


def _fraction(text: str, lang: Language) -> str | None:
    m = _FRACTION.fullmatch(text)
    if m is None or int(m.group("den")) == 0:
        return None
    num, den = int(m.group("num")), int(m.group("den"))
    whole = m.group("whole")
    if lang == "zh":
        words = f"{rules_zh.cardinal(den)}分之{rules_zh.cardinal(num)}"
        return f"{rules_zh.cardinal(whole)}又{words}" if whole else words
    if den == 2:
        part = "half" if num == 1 else "halves"
    elif den == 4:
        part = "quarter" if num == 1 else "quarters"
    else:
        part = ordinal_words(den) + ("" if num == 1 else "s")
    words = f"{rules_en.cardinal(num)} {part}"
    return f"{rules_en.cardinal(whole)} and {words}" if whole else words


def year_words(year: int) -> str:
    """2024 -> 'twenty twenty four', 2005 -> 'two thousand five', 1990 -> 'nineteen ninety'."""
    if 2001 <= year <= 2009:
        return f"two thousand {rules_en.cardinal(year - 2000)}"
    if year % 1000 == 0 or not 1000 <= year <= 9999:
        return rules_en.cardinal(year)
    high, low = divmod(year, 100)
    if low == 0:
        return f"{rules_en.cardinal(high)} hundred"
    return f"{rules_en.cardinal(high)} {'oh ' if low < 10 else ''}{rules_en.cardinal(low)}"


def _date(text: str, lang: Language, fmt: str | None) -> str | None:
    numbers = _DATE_PARTS.findall(text)
    if not numbers or re.search(r"[^\d\s/.\-年月日,]", text):
        return None
    order = (fmt or "").lower() or ("ymd" if len(numbers[0]) == 4 or lang == "zh" else "mdy")[
        : len(numbers)
    ]
    if len(order) != len(numbers) or set(order) - set("ymd"):
        return None
    fields = {k: int(v) for k, v in zip(order, numbers, strict=True)}
    year, month, day = fields.get("y"), fields.get("m"), fields.get("d")
    if (month is not None and not 1 <= month <= 12) or (day is not None and not 1 <= day <= 31):
        return None
    if lang == "zh":
        out = f"{rules_zh.digits(str(year))}年" if year is not None else ""
        out += f"{rules_zh.cardinal(month)}月" if month is not None else ""
        return out + (f"{rules_zh.cardinal(day)}日" if day is not None else "")
    words = []
    month_name = _MONTHS[month - 1] if month is not None else None
    if day is not None and month_name is not None and order.index("d") < order.index("m"):
        words.append(f"the {ordinal_words(day)} of {month_name}")
    else:
        words += [w for w in (month_name, day and ordinal_words(day)) if w]
    if year is not None:
        words.append(year_words(year))
    return " ".join(words)


def _by_rules(text: str, lang: Language) -> str | None:
    """The normalizer's own pattern rules (units, clock times, phone numbers)."""
    rules = rules_zh if lang == "zh" else rules_en
    out = rules.before_library(Traced.source(text.strip())).text
    return out if out != text.strip() else None


def _time(text: str, lang: Language) -> str | None:
    if lang == "zh":
        m = re.fullmatch(r"\s*(\d{1,2})[:：](\d{2})(?::\d{2})?\s*", text)
        if m is None:
            return None
        hour, minute = int(m.group(1)), int(m.group(2))
        return f"{rules_zh.cardinal(hour)}点" + (
            f"{rules_zh.cardinal(minute)}分" if minute else "整"
        )
    return _by_rules(text, lang)


def _telephone(text: str, lang: Language) -> str | None:
    """Digit by digit, a pause per group, whatever the grouping looks like."""
    groups = re.findall(r"\+?\d+", text)
    if not groups:
        return None
    if lang == "zh":
        return "，".join(
            ("加" if g.startswith("+") else "") + rules_zh.digits(g, "零幺二三四五六七八九")
            for g in groups
        )
    return ", ".join(
        ("plus " if g.startswith("+") else "") + rules_en.digits(g, zero="oh") for g in groups
    )


_PLAIN: dict[str, Callable[[str, Language], str | None]] = {
    "characters": _characters,
    "spell-out": _characters,
    "verbatim": _characters,
    "cardinal": _cardinal,
    "number": _cardinal,
    "ordinal": _ordinal,
    "digits": _digits,
    "fraction": _fraction,
    "time": _time,
    "telephone": _telephone,
    "unit": _by_rules,
}
INTERPRETATIONS = (*_PLAIN, "date")
"""The `interpret-as` values read here."""


def say_as(interpret_as: str, text: str, lang: Language, fmt: str | None = None) -> str:
    """`text` read as `interpret_as` (one of INTERPRETATIONS), in words; as written when the
    class cannot read it. `fmt`: the `format` attribute (dates: "mdy", "dmy", "ymd", "md" ...)."""
    words = _date(text, lang, fmt) if interpret_as == "date" else _PLAIN[interpret_as](text, lang)
    return text if words is None else words
