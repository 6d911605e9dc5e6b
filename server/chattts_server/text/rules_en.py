"""English rules that run before WeTextProcessing, for what it reads wrongly or not at all.

Each rule turns a pattern into words, so the library never sees it. Measured misreadings that
made these rules necessary: "200 m" -> "two hundred minutes" (here m after a number means
meters, as in navigation; minutes are "min"); "$0.50" -> "zero point five dollars"; "I-95" ->
"I-ninety five" (ChatTTS reads the hyphen as a pause); "+1 555 123 4567" fails; "9am" -> "nine
AM" (the tokenizer lowercases it to the word "am"); "-3°C" -> "negative three degrees".
"""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

from .spans import Traced

_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def cardinal(number: str | int) -> str:
    """'1,234' -> 'one thousand two hundred and thirty four' (no hyphens or commas)."""
    value = int(str(number).replace(",", ""))
    return str(num2words(value)).replace("-", " ").replace(",", "")


def decimal(number: str) -> str:
    """'1.5' -> 'one point five'; '12' -> 'twelve'. Digits after the point one by one."""
    whole, _, frac = number.partition(".")
    words = cardinal(whole or "0")
    if frac:
        words += " point " + digits(frac)
    return words


def digits(run: str, zero: str = "zero") -> str:
    """'0800' -> 'zero eight zero zero' (or 'oh eight oh oh' with zero='oh')."""
    return " ".join(zero if d == "0" else _DIGIT_WORDS[int(d)] for d in run if d.isdigit())


_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)"

# -- currency ------------------------------------------------------------------------------
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "", ""),
}
# fmt: off
_SCALES = {
    "k": "thousand", "thousand": "thousand", "m": "million", "mn": "million",
    "million": "million", "b": "billion", "bn": "billion", "billion": "billion",
    "trillion": "trillion",
}
# fmt: on
_CURRENCY = re.compile(
    rf"(?<![\w])(?P<sym>[$£€¥])\s?(?P<int>{_NUM})(?:[.,](?P<frac>\d{{1,2}})(?!\d))?"
    r"(?:\s?(?P<scale>k|mn|m|bn|b|thousand|million|billion|trillion)\b)?"
)


def _currency(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCIES[m.group("sym")]
    whole = int(m.group("int").replace(",", ""))
    frac = m.group("frac")
    if m.group("scale"):
        amount = decimal(f"{whole}.{frac}" if frac else str(whole))
        return f"{amount} {_SCALES[m.group('scale').lower()]} {many}"
    cents = int(frac.ljust(2, "0")) if frac else 0
    parts = []
    if whole or not cents:
        parts.append(f"{cardinal(whole)} {one if whole == 1 else many}")
    if cents:
        if whole and sub_one:
            parts.append(cardinal(cents))  # "four dollars fifty", as people say prices
        elif sub_one:
            parts.append(f"{cardinal(cents)} {sub_one if cents == 1 else sub_many}")
        else:
            return f"{decimal(f'{whole}.{frac}')} {many}"
    return " ".join(parts)


# -- temperatures --------------------------------------------------------------------------
_TEMPERATURE = re.compile(
    r"(?<![\w.])(?P<sign>[-−–])?(?P<num>\d+(?:\.\d+)?)\s?(?P<unit>°\s?[CcFf]|℃|℉|°)(?![A-Za-z])"
)


def _temperature(m: re.Match[str]) -> str:
    unit = m.group("unit").replace(" ", "").upper()
    scale = {"°C": " Celsius", "℃": " Celsius", "°F": " Fahrenheit", "℉": " Fahrenheit"}
    number = decimal(m.group("num"))
    degrees = "degree" if m.group("num") == "1" else "degrees"
    sign = "minus " if m.group("sign") else ""
    return f"{sign}{number} {degrees}{scale.get(unit, '')}"


# -- units of distance, speed and time ---------------------------------------------------
_UNITS = {
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "kmh": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "m/s": ("meter per second", "meters per second"),
    "km": ("kilometer", "kilometers"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "yd": ("yard", "yards"),
    "yds": ("yard", "yards"),
    "m": ("meter", "meters"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
}
_UNIT_NAMES = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
_UNIT = re.compile(rf"(?<![\w.,])(?P<num>{_NUM}(?:\.\d+)?)\s?(?P<unit>{_UNIT_NAMES})(?![\w/])")
_RANGE = re.compile(
    rf"(?<![\w.,-])(?P<a>\d+(?:\.\d+)?)\s?[-–]\s?(?P<b>\d+(?:\.\d+)?)"
    rf"(?=\s?(?:(?:{_UNIT_NAMES})(?![\w/])|[%°℃℉]))"
)


def _unit(m: re.Match[str]) -> str:
    one, many = _UNITS[m.group("unit")]
    number = m.group("num").replace(",", "")
    return f"{decimal(number)} {one if number == '1' else many}"


# -- times of day ---------------------------------------------------------------------------
_AMPM = r"(?P<ap>[AaPp])\.?\s?[Mm]\.?(?![A-Za-z])"
_CLOCK = re.compile(
    rf"(?<![\d:.])(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)(?::[0-5]\d)?(?![\d:])(?:\s?{_AMPM})?"
)
_HOUR_AMPM = re.compile(rf"(?<![\w:.])(?P<h>1[0-2]|0?\d)\s?{_AMPM}")


def _ampm(m: re.Match[str]) -> str:
    return f" {m.group('ap').lower()} m" if m.group("ap") else ""


def _clock(m: re.Match[str]) -> str:
    hour, minute = int(m.group("h")), int(m.group("m"))
    if minute == 0:
        tail = "" if m.group("ap") else (" o clock" if hour <= 12 else " hundred")
    elif minute < 10:
        tail = f" oh {cardinal(minute)}"
    else:
        tail = f" {cardinal(minute)}"
    return f"{cardinal(hour)}{tail}{_ampm(m)}"


def _hour_ampm(m: re.Match[str]) -> str:
    return f"{cardinal(m.group('h'))}{_ampm(m)}"


# -- road names, phone numbers --------------------------------------------------------------
# I-95, US-101, M25, A4, B1234, E40: letters then the road number, read as people say it; a
# compass letter after it is the direction of travel ("I-95 N": "I ninety five north").
_ROAD = re.compile(
    r"\b(?P<pre>[A-Z]{1,3})-?(?P<num>\d{1,4})(?P<suf>[A-Z]?)\b"
    r"(?:(?P<gap>\s)(?P<dir>[NSEW]B?)\b(?![.'-]\w))?"
)
_DIRECTIONS = {"N": "north", "S": "south", "E": "east", "W": "west"}


def road_number(run: str) -> str:
    """'95' -> 'ninety five', '405' -> 'four oh five', '280' -> 'two eighty', '1234' digit by digit."""
    if len(run) <= 2:
        return cardinal(run)
    if len(run) == 3 and run[0] != "0":
        rest = int(run[1:])
        if rest == 0:
            return cardinal(run)
        return f"{cardinal(run[0])} {'oh ' + cardinal(rest) if rest < 10 else cardinal(rest)}"
    return digits(run)


def _road(m: re.Match[str]) -> str:
    if len(m.group("pre")) == 3 and "-" not in m.group():
        return m.group()  # e.g. 'ABC123': a code, not a road; the final pass reads it
    suffix = f" {m.group('suf')}" if m.group("suf") else ""
    heading = ""
    if m.group("dir"):
        heading = (
            " " + _DIRECTIONS[m.group("dir")[0]] + ("bound" if len(m.group("dir")) > 1 else "")
        )
    return f"{m.group('pre')} {road_number(m.group('num'))}{suffix}{heading}"


# -- street words ---------------------------------------------------------------------------
# "St." is Street after a street's name ("Main St.", "5th St") and Saint before a name
# ("St. Louis", "toward St. Mary's"); "Dr." likewise Drive or Doctor. The rest have one reading.
# fmt: off
_STREET_WORDS = {
    "Ave": "Avenue", "Av": "Avenue", "Rd": "Road", "Blvd": "Boulevard", "Ln": "Lane",
    "Hwy": "Highway", "Pkwy": "Parkway", "Expy": "Expressway", "Fwy": "Freeway", "Ct": "Court",
    "Pl": "Place", "Sq": "Square", "Cir": "Circle", "Ter": "Terrace",
}
# fmt: on
_BEFORE_A_NAME = {"St": ("Street", "Saint"), "Dr": ("Drive", "Doctor"), "Mt": ("Mount", "Mount")}
_STREET = re.compile(
    rf"\b(?P<abbr>{'|'.join([*_STREET_WORDS, *_BEFORE_A_NAME])})\b(?P<dot>\.)?(?!\w|\.\w)"
)
_NAME_BEFORE = re.compile(r"(?:\b[A-Z][\w'’]*|\b\d+(?:st|nd|rd|th)?)\s+$")
_NAME_AFTER = re.compile(r"\s+[A-Z]")


def _street(m: re.Match[str]) -> str:
    abbr, text = m.group("abbr"), m.string
    named_before = bool(_NAME_BEFORE.search(text, 0, m.start()))
    name_after = bool(_NAME_AFTER.match(text, m.end()))
    if abbr in _BEFORE_A_NAME:
        street, title = _BEFORE_A_NAME[abbr]
        if name_after and not named_before:
            return title  # "St. Louis": the period is the abbreviation's, not a sentence end
        word = street
    else:
        word = _STREET_WORDS[abbr]
    # "Main St. Then": the period also ends the sentence; "Main St. then": it does not.
    ends = m.group("dot") and (m.end() == len(text) or name_after)
    return word + ("." if ends else "")


def street_words(text: Traced) -> Traced:
    """Only the street-word rule: for English street names inside Chinese text."""
    return text.sub(_STREET, _street)


# +1 555 123 4567, (555) 123-4567, 0800 123 456, 555-1234: digits one by one, a pause per group.
_PHONE = re.compile(
    r"(?<![\w.,+-])(?P<num>(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,5}\)\s?)?\d{2,5}(?:[\s.-]\d{2,5}){1,4})(?![\w.-]?\d)"
)
_ISO_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}")


def _phone(m: re.Match[str]) -> str:
    text = m.group("num")
    num_digits = sum(c.isdigit() for c in text)
    plain_groups = not re.search(r"[+()-]", text)
    if _ISO_DATE.fullmatch(text) or num_digits < 7:
        return text
    if plain_groups and not re.search(r"(?:^|\s)0", text):
        return text  # "1 000 000" or a list of numbers, not a phone number
    groups = re.findall(r"\+?\d+", text)
    spoken = [("plus " if g.startswith("+") else "") + digits(g, zero="oh") for g in groups]
    return ", ".join(spoken)


_GROUPED = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,]|\.\d)")

# -- small symbols --------------------------------------------------------------------------
_SMALL = (
    (re.compile(r"\bNo\.\s?(?=\d)"), "number "),
    # 2.0.1: a version or a section, every dot read as "point".
    (re.compile(r"\b\d+(?:\.\d+){2,}\b"), lambda m: " point ".join(m.group().split("."))),
    (re.compile(r"\b24/7\b"), "twenty four seven"),
    (re.compile(r"\s?&\s?"), " and "),
    (re.compile(r"(?<=\d)\s?x\s?(?=\d)"), " by "),
)

RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    *_SMALL,
    (_PHONE, _phone),
    (_RANGE, lambda m: f"{decimal(m.group('a'))} to {m.group('b')}"),
    (_CURRENCY, _currency),
    (_TEMPERATURE, _temperature),
    (_UNIT, _unit),
    (_CLOCK, _clock),
    (_HOUR_AMPM, _hour_ampm),
    (_ROAD, _road),
    (_STREET, _street),
    # WeTextProcessing reads "1,234" as "thousand two hundred ..." (no "one").
    (_GROUPED, lambda m: decimal(m.group().replace(",", ""))),
)


def before_library(text: Traced) -> Traced:
    """The rules in order, each replacement traced to what it replaced."""
    for pattern, repl in RULES:
        text = text.sub(pattern, repl)
    return text


_AFTER = (
    (re.compile(r"\bo'clock\b"), "o clock"),
    (re.compile(r"\b([AaPp])M\b"), lambda m: f"{m.group(1).lower()} m"),
    (re.compile(r"(?<=[A-Za-z])-(?=[A-Za-z])"), " "),
)


def after_library(text: Traced) -> Traced:
    for pattern, repl in _AFTER:
        text = text.sub(pattern, repl)
    return text


_DIGIT_RUN = re.compile(r"\d+")


def spell_digits(text: Traced) -> Traced:
    """Final pass: any digit run left becomes words ('007' digit by digit, '42' as a number)."""

    def run(m: re.Match[str]) -> str:
        s = m.group()
        words = digits(s) if s.startswith("0") or len(s) > 9 else cardinal(s)
        return f" {words} "

    return text.sub(_DIGIT_RUN, run)
