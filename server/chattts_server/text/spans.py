"""Where each character of a derived text came from in the caller's own text.

Every stage of the text front end turns a text into another: markdown drops markup, the release
policy cuts and squeezes whitespace, normalization spells "200 m" as "two hundred meters",
ChatTTS's normalizer swaps homophones, refine inserts pauses. A `Traced` text carries, for each
of its characters, the range of the caller's text it came from (a `SpanMap`), so a word spoken
in the end can be shown as the caller wrote it:

    t = Traced.source("in 200 m turn")
    t = t.sub(re.compile(r"200 m"), "two hundred meters")
    t.span(3, 21)       # (3, 8): "two hundred meters" came from "200 m"
    t.span(0, 2)        # (0, 2): "in" is itself

Offsets are Python string indices: Unicode code points, not UTF-16 units (JavaScript strings
count those; `utf16_offset` converts) and not UTF-8 bytes. For a stream they index the
concatenation of every fragment the caller sent, whitespace and cleared text included.

Stages we write ourselves trace exactly: a regex substitution maps its replacement to the span of
its match (`Traced.sub`), a character map maps each output to its input character. A stage we
cannot see into (the WeTextProcessing grammars, ChatTTS's normalizer, the refine pass) is traced
by aligning its output with its input word by word (`align`): unchanged words anchor, and each
changed run of words maps to the run it replaced. Characters that come from no caller text (a
period markdown adds after a list item, a joining space) map to None. Maps are monotonic: a later
character never maps before an earlier one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher

from .script import CJK_CHARS

Span = tuple[int, int]
"""[start, end) in code points of the caller's text."""

KANA = "\u3040-\u30ff"
"""Hiragana and katakana, as a character-class body: a Japanese character is a word, as a
Chinese one is."""

_ALIGN_TOKEN = re.compile(rf"[{CJK_CHARS}{KANA}]|[^\W_{CJK_CHARS}{KANA}]+|\S")


def union(spans: Iterable[Span | None]) -> Span | None:
    """The smallest span holding every given one; None if none is given."""
    start = end = -1
    for span in spans:
        if span is None:
            continue
        if start < 0 or span[0] < start:
            start = span[0]
        end = max(end, span[1])
    return None if start < 0 else (start, end)


@dataclass(frozen=True)
class SpanMap:
    """For each character of a derived text, the source range it came from, or None."""

    ranges: tuple[Span | None, ...]

    @classmethod
    def identity(cls, num_chars: int, offset: int = 0) -> SpanMap:
        """A text that is its source, starting at `offset` of it."""
        return cls(tuple((i, i + 1) for i in range(offset, offset + num_chars)))

    @classmethod
    def run(cls, num_chars: int, span: Span | None) -> SpanMap:
        """Characters that all came from one source range (a replacement), or from none."""
        return cls((span,) * num_chars)

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, index: slice) -> SpanMap:
        return SpanMap(self.ranges[index])

    def __add__(self, other: SpanMap) -> SpanMap:
        return SpanMap(self.ranges + other.ranges)

    def span(self, start: int = 0, end: int | None = None) -> Span | None:
        """The source range that derived characters [start, end) came from; None if none."""
        return union(self.ranges[start:end])

    def shift(self, offset: int) -> SpanMap:
        """The same map into a source that starts `offset` characters later."""
        return SpanMap(
            tuple(None if r is None else (r[0] + offset, r[1] + offset) for r in self.ranges)
        )

    def compose(self, inner: SpanMap) -> SpanMap:
        """`self` maps this text into a middle text, `inner` maps the middle text into the
        source: the map of this text into the source."""
        out: list[Span | None] = []
        last: Span | None = None
        last_out: Span | None = None
        for r in self.ranges:
            if r is None:
                out.append(None)
                continue
            if r != last:  # a replaced run maps many characters to one range
                last, last_out = r, inner.span(r[0], r[1])
            out.append(last_out)
        return SpanMap(tuple(out))


def align(source: str, derived: str) -> SpanMap:
    """Map `derived`, the output of a stage we cannot see into, to `source`, its input.

    Both are cut into tokens (a CJK or kana character, a run of letters and digits, any other
    character) and matched by difflib: equal tokens (case-folded) map character by character,
    each replaced run of tokens maps as a whole to the run it replaced, inserted tokens map to
    None. "in 200 m turn" -> "in two hundred meters turn" maps "two hundred meters" to "200 m"."""
    if source == derived:
        return SpanMap.identity(len(source))
    src = [(m.start(), m.end(), m.group().casefold()) for m in _ALIGN_TOKEN.finditer(source)]
    dst = [(m.start(), m.end(), m.group().casefold()) for m in _ALIGN_TOKEN.finditer(derived)]
    ranges: list[Span | None] = [None] * len(derived)
    matcher = SequenceMatcher(None, [t[2] for t in src], [t[2] for t in dst], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for (sa, sb, _), (da, db, _) in zip(src[i1:i2], dst[j1:j2], strict=True):
                for k in range(db - da):
                    # Case folding may change a length (ß, ss): then the token maps whole.
                    ranges[da + k] = (sa + k, sa + k + 1) if sb - sa == db - da else (sa, sb)
        elif op == "replace":
            span = (src[i1][0], src[i2 - 1][1])
            for k in range(dst[j1][0], dst[j2 - 1][1]):
                ranges[k] = span
    return SpanMap(tuple(ranges))


@dataclass(frozen=True)
class Traced:
    """A text and, for each of its characters, where it came from in the caller's text."""

    text: str
    spans: SpanMap

    def __post_init__(self) -> None:
        if len(self.text) != len(self.spans):
            raise ValueError(f"{len(self.text)} characters but {len(self.spans)} spans")

    @classmethod
    def source(cls, text: str, offset: int = 0) -> Traced:
        """The caller's own text, which starts at `offset` of everything it sent."""
        return cls(text, SpanMap.identity(len(text), offset))

    @classmethod
    def inserted(cls, text: str) -> Traced:
        """Text from no caller text (a period markdown adds, a joining space)."""
        return cls(text, SpanMap.run(len(text), None))

    def __len__(self) -> int:
        return len(self.text)

    def __bool__(self) -> bool:
        return bool(self.text)

    def __getitem__(self, index: slice) -> Traced:
        return Traced(self.text[index], self.spans[index])

    def __add__(self, other: Traced) -> Traced:
        return Traced(self.text + other.text, self.spans + other.spans)

    def span(self, start: int = 0, end: int | None = None) -> Span | None:
        """The caller's range that characters [start, end) of this text came from."""
        return self.spans.span(start, end)

    def compose(self, inner: Traced) -> Traced:
        """This text traced into `inner.text`, retraced to where `inner` came from (the spoken
        text of an utterance, then the utterance into the stream)."""
        return Traced(self.text, self.spans.compose(inner.spans))

    def strip(self) -> Traced:
        stripped = self.text.strip()
        if len(stripped) == len(self.text):
            return self
        start = len(self.text) - len(self.text.lstrip())
        return self[start : start + len(stripped)]

    def rstrip(self) -> Traced:
        return self[: len(self.text.rstrip())]

    def sub(self, pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str]) -> Traced:
        """`pattern.sub(repl, text)`, the same text, each replacement traced to its match's span
        as a whole (a match that comes out unchanged keeps its own spans)."""
        text, ranges = self.text, self.spans.ranges
        out: list[str] = []
        out_ranges: list[Span | None] = []
        last = 0
        plain = isinstance(repl, str) and "\\" not in repl  # no group references to expand
        for m in pattern.finditer(text):
            new = repl(m) if callable(repl) else repl if plain else m.expand(repl)
            if new == m.group():
                continue
            out.append(text[last : m.start()])
            out_ranges += ranges[last : m.start()]
            out.append(new)
            # " & " read as " and " comes from the "&": spaces at a match's ends are no source.
            start, end = m.start(), m.end()
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            out_ranges += (self.spans.span(start, end),) * len(new)
            last = m.end()
        if not out:
            return self
        out.append(text[last:])
        out_ranges += ranges[last:]
        return Traced("".join(out), SpanMap(tuple(out_ranges)))

    def map_chars(self, fn: Callable[[str], str]) -> Traced:
        """Each character replaced by `fn(character)` (none, itself, or others), traced to it."""
        out: list[str] = []
        out_ranges: list[Span | None] = []
        for c, r in zip(self.text, self.spans.ranges, strict=True):
            new = fn(c)
            out.append(new)
            out_ranges += (r,) * len(new)
        text = "".join(out)
        return self if text == self.text else Traced(text, SpanMap(tuple(out_ranges)))

    def rewrite(self, new_text: str) -> Traced:
        """`new_text`, the output of a stage we cannot see into, traced by `align`."""
        if new_text == self.text:
            return self
        return Traced(new_text, align(self.text, new_text).compose(self.spans))

    @staticmethod
    def concat(parts: Iterable[Traced]) -> Traced:
        parts = list(parts)
        return Traced(
            "".join(p.text for p in parts), SpanMap(tuple(r for p in parts for r in p.spans.ranges))
        )

    @staticmethod
    def join(separator: str, parts: Iterable[Traced]) -> Traced:
        """`separator.join(...)`: the separators come from no caller text."""
        out: list[Traced] = []
        for part in parts:
            if out:
                out.append(Traced.inserted(separator))
            out.append(part)
        return Traced.concat(out)


EMPTY = Traced("", SpanMap(()))


def utf16_offset(text: str, offset: int) -> int:
    """Code point `offset` of `text` in UTF-16 units, as a JavaScript client counts."""
    return offset + sum(1 for c in text[:offset] if ord(c) > 0xFFFF)
