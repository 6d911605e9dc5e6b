"""Chinese rules that run before WeTextProcessing, for what it reads wrongly or not at all.

Measured misreadings that made these rules necessary: "4.50元" -> "四点五零元" (people say
"四元五角"); "-3℃" -> "负三摄氏度" (a forecast says "零下三摄氏度"); "1,234" -> "一,两百三十四";
"(010)12345678" -> "(零十)一千二百三十四万..." (a phone number is read digit by digit, 1 as 幺).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from . import rules_en
from .spans import Traced

_DIGITS = "零一二三四五六七八九"
_PHONE_DIGITS = "零幺二三四五六七八九"


def cardinal(number: str | int) -> str:
    """'120' -> '一百二十' (cn2an)."""
    import cn2an

    return str(cn2an.an2cn(str(int(number))))


def decimal(number: str) -> str:
    """'2.50' -> '二点五' (trailing zeros of the fraction dropped)."""
    whole, _, frac = number.partition(".")
    frac = frac.rstrip("0")
    words = cardinal(whole or "0")
    return words + ("点" + digits(frac) if frac else "")


def digits(run: str, table: str = _DIGITS) -> str:
    return "".join(table[int(d)] for d in run if d.isdigit())


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")

# 010-12345678, (010)12345678, +86 138 1234 5678, 400-123-4567: digit by digit, a pause per group.
_PHONE = re.compile(
    r"(?<![\d.])(?P<num>(?:\+\d{1,3}[\s-]?)?(?:[(（]\d{2,4}[)）]\s?)?\d{3,4}(?:[\s-]\d{3,4}){1,3}|[(（]\d{2,4}[)）]\s?\d{5,8}|1[3-9]\d{9})(?![\d.])"
)
_ISO_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}")


def _phone(m: re.Match[str]) -> str:
    text = m.group("num")
    if _ISO_DATE.fullmatch(text) or sum(c.isdigit() for c in text) < 7:
        return text
    groups = re.findall(r"\+?\d+", text)
    return "，".join(("加" if g.startswith("+") else "") + digits(g, _PHONE_DIGITS) for g in groups)


_YUAN = re.compile(
    r"(?:[¥￥]\s?(?P<a>\d+)(?:\.(?P<af>\d{1,2}))?(?:元|块)?)|(?:(?P<b>\d+)(?:\.(?P<bf>\d{1,2}))?\s?(?:元|块钱|块))"
)


def _yuan(m: re.Match[str]) -> str:
    whole = int(m.group("a") or m.group("b"))
    frac = (m.group("af") or m.group("bf") or "").ljust(2, "0")
    jiao, fen = int(frac[0]), int(frac[1])
    out = f"{cardinal(whole)}元" if whole or not (jiao or fen) else ""
    if jiao:
        out += f"{_DIGITS[jiao]}角"
    elif fen and whole:
        out += "零"
    if fen:
        out += f"{_DIGITS[fen]}分"
    return out


_FOREIGN = re.compile(r"(?P<sym>[$€£])\s?(?P<num>\d+(?:\.\d+)?)")
_FOREIGN_NAMES = {"$": "美元", "€": "欧元", "£": "英镑"}

_BELOW_ZERO = re.compile(r"(?<![\d.])[-−–](?P<num>\d+(?:\.\d+)?)\s?(?P<unit>℃|°\s?[Cc]|度)")
_TEMPERATURE = re.compile(r"(?<![\d.])(?P<num>\d+(?:\.\d+)?)\s?(?P<unit>℃|°\s?[Cc])")

_UNITS = {"km/h": "公里每小时", "kph": "公里每小时", "mph": "英里每小时", "km": "公里", "m": "米"}
_UNIT = re.compile(
    r"(?<![A-Za-z0-9.])(?P<num>\d+(?:\.\d+)?)\s?(?P<unit>km/h|kph|mph|km|m)(?![A-Za-z/])"
)

RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_THOUSANDS, ""),
    (_PHONE, _phone),
    (_YUAN, _yuan),
    (_FOREIGN, lambda m: decimal(m.group("num")) + _FOREIGN_NAMES[m.group("sym")]),
    (
        _BELOW_ZERO,
        lambda m: f"零下{decimal(m.group('num'))}{'度' if m.group('unit') == '度' else '摄氏度'}",
    ),
    (_TEMPERATURE, lambda m: f"{decimal(m.group('num'))}摄氏度"),
    (_UNIT, lambda m: decimal(m.group("num")) + _UNITS[m.group("unit")]),
)


def before_library(text: Traced) -> Traced:
    """The rules in order, each replacement traced to what it replaced; English street words
    ("进入Main St.") read as in English text."""
    for pattern, repl in RULES:
        text = text.sub(pattern, repl)
    return rules_en.street_words(text)


_DIGIT_RUN = re.compile(r"\d+")


def spell_digits(text: Traced) -> Traced:
    """Final pass: any digit left is read one by one."""
    return text.sub(_DIGIT_RUN, lambda m: digits(m.group()))
