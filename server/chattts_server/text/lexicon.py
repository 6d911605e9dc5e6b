"""Pronunciation lexicons applied to a text: each grapheme the caller wrote is read as its alias.

    nav = Lexicon.build("nav", [("I-95", "Interstate ninety-five")])
    Lexicons((nav,)).apply(Traced.source("Take I-95 north."))
    # 'Take Interstate ninety-five north.', each character of the alias traced to "I-95"

A stream's lexicons are applied to each utterance it speaks, after markdown is removed and the
release policy has cut it, before the engine's normalizer spells out numbers and symbols (so
"I-95" is still "I-95" to match). Word timing then points each word of the alias at the
grapheme, as it points "two hundred meters" at "200 m".

Matching. PLS 1.0 leaves it to the processor; its Appendix C asks for whole tokens and the
longest match first, which is what is done:

- whole words: a grapheme that starts (ends) with a letter or digit of a spaced script matches
  only where the text has no letter, digit or underscore of a spaced script just before (after)
  it, so "do" is not found in "done", while "I-95" is in "(I-95)" and in "走I-95上". A grapheme
  made of Chinese or Japanese characters matches anywhere: those scripts put no spaces between
  words.
- the longest first, the leftmost first, no overlap: the text is read from the left; where
  graphemes of any of the lexicons match, the longest is replaced and reading goes on after it.
- case as written ("US" is not "us"): PLS says nothing of case, so nothing is folded.
- a space in a grapheme matches any run of whitespace in the text ("Zhongguancun  St").
- never inside a link, e-mail address, domain or file name (text/readable.py's patterns): the
  normalizer spells those as a whole.
- several lexicons are read together; for the same grapheme the later one wins.

Cost does not grow with a lexicon's size: each lexicon is one dict of its graphemes (to the
alias) and of every proper prefix of them (to ""); at each character of the text a set lookup
says whether any grapheme starts with it, and only there a walk of lookups stops at the first
string that starts no grapheme (docs/retired-benchmarks.md: measured at 10 to 50,000 lexemes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .readable import link_spans
from .spans import Span, SpanMap, Traced

_UNUSUAL_SPACE = re.compile(r"\s\s|[^\S ]")
"""Whitespace that is not one plain space: the text is squeezed before matching."""
_SPACELESS = "\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff"
"""Kana and CJK ideographs, as a character-class body (`_spaceless`)."""
_MAY_START = re.compile(rf"(?<![^\W{_SPACELESS}])\S|[{_SPACELESS}]")
"""Where a grapheme may start: after no letter, digit or underscore of a spaced script, or at
a Chinese or Japanese character."""


def _spaceless(c: str) -> bool:
    """A Chinese or Japanese character: a word of its own, found anywhere."""
    return "\u3040" <= c <= "\u30ff" or "\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff"


def _is_word(c: str) -> bool:
    """A letter, digit or underscore of a spaced script: what a whole word may not touch."""
    return (c.isalnum() or c == "_") and not _spaceless(c)


@dataclass(frozen=True, eq=False)
class Lexicon:
    """One lexicon, compiled: its graphemes and their aliases, ready to match."""

    name: str
    keys: Mapping[str, str]
    """Each grapheme -> its alias, and each proper prefix of a grapheme -> "" (if it is no
    grapheme itself): a walk along the text stops at the first key missing."""
    first_chars: frozenset[str]
    max_chars: int
    """The longest grapheme's length."""
    num_graphemes: int

    @classmethod
    def build(cls, name: str, entries: Iterable[tuple[str, str]]) -> Lexicon:
        """A lexicon of (grapheme, alias) pairs; the first pair of a grapheme wins. Graphemes
        are whitespace-normalized here (as PLS's are read)."""
        keys: dict[str, str] = {}
        num_graphemes = 0
        for grapheme, alias in entries:
            grapheme = " ".join(grapheme.split())
            if not grapheme or not alias or keys.get(grapheme):
                continue
            keys[grapheme] = alias
            num_graphemes += 1
            for end in range(len(grapheme) - 1, 0, -1):
                if grapheme[:end] in keys:
                    break  # and so are all its prefixes
                keys[grapheme[:end]] = ""
        return cls._of(name, keys, num_graphemes)

    @classmethod
    def merge(cls, name: str, lexicons: Iterable[Lexicon]) -> Lexicon:
        """One lexicon holding all of `lexicons`; for the same grapheme the later one wins."""
        keys: dict[str, str] = {}
        for lexicon in lexicons:
            for key, alias in lexicon.keys.items():
                if alias or key not in keys:
                    keys[key] = alias
        return cls._of(name, keys, sum(1 for alias in keys.values() if alias))

    @classmethod
    def _of(cls, name: str, keys: dict[str, str], num_graphemes: int) -> Lexicon:
        first = frozenset(key[0] for key in keys)
        return cls(name, keys, first, max(map(len, keys), default=0), num_graphemes)

    def longest(self, text: str, start: int, stop: int) -> tuple[int, str]:
        """(end, alias) of the longest grapheme at text[start:end] that ends a word, end <=
        stop; (0, "") when none does."""
        keys = self.keys
        found: tuple[int, str] = (0, "")
        for end in range(start + 1, min(stop, start + self.max_chars) + 1):
            alias = keys.get(text[start:end])
            if alias is None:
                break
            if alias and _ends_word(text, end):
                found = (end, alias)
        return found


def _ends_word(text: str, end: int) -> bool:
    return end == len(text) or _spaceless(text[end - 1]) or not _is_word(text[end])


@dataclass(frozen=True)
class Match:
    """A grapheme found in a text, [start, end) in its code points, and the alias said for it."""

    start: int
    end: int
    alias: str


@dataclass(frozen=True)
class Lexicons:
    """Lexicons read together, in order (the later wins for the same grapheme)."""

    lexicons: tuple[Lexicon, ...]
    _first_chars: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        first = frozenset().union(*(lexicon.first_chars for lexicon in self.lexicons))
        object.__setattr__(self, "_first_chars", first)

    def __bool__(self) -> bool:
        return bool(self.lexicons)

    def __add__(self, more: Iterable[Lexicon]) -> Lexicons:
        """These lexicons, then `more` (which win for the same grapheme)."""
        return Lexicons((*self.lexicons, *more))

    @property
    def names(self) -> list[str]:
        return [lexicon.name for lexicon in self.lexicons]

    def apply(self, text: Traced) -> Traced:
        """`text` with each grapheme found replaced by its alias, the alias's characters all
        traced to the grapheme's span."""
        found = self.find(text.text)
        if not found:
            return text
        source, ranges = text.text, text.spans.ranges
        out: list[str] = []
        out_ranges: list[Span | None] = []
        last = 0
        for m in found:
            out.append(source[last : m.start])
            out_ranges += ranges[last : m.start]
            out.append(m.alias)
            out_ranges += (text.spans.span(m.start, m.end),) * len(m.alias)
            last = m.end
        out.append(source[last:])
        out_ranges += ranges[last:]
        return Traced("".join(out), SpanMap(tuple(out_ranges)))

    def find(self, text: str) -> list[Match]:
        """The graphemes found in `text`, left to right, by the rules above."""
        if not self._first_chars:
            return []
        squeezed, where = _squeeze(text)
        # Found without links, the same unless one of them is in a link (then found again,
        # around the links): links are looked for only in the words where a grapheme was found.
        found = self._find(squeezed, [])
        if any(_in_link(squeezed, m) for m in found):
            found = self._find(squeezed, link_spans(squeezed))
        if where is None:
            return found
        return [Match(where[m.start][0], where[m.end - 1][1], m.alias) for m in found]

    def _find(self, text: str, links: list[Span]) -> list[Match]:
        """The matches in `text`, none overlapping `links`."""
        first, lexicons, n = self._first_chars, self.lexicons, len(text)
        found: list[Match] = []
        next_link = 0
        at = 0
        for start in _MAY_START.finditer(text):
            if start.start() < at or start.group() not in first:
                continue
            at = start.start()
            stop = n
            while next_link < len(links) and links[next_link][1] <= at:
                next_link += 1
            if next_link < len(links):
                link_start, link_end = links[next_link]
                if link_start <= at:
                    at = link_end
                    continue
                stop = link_start
            end, alias = 0, ""
            for lexicon in lexicons:
                this_end, this_alias = lexicon.longest(text, at, stop)
                if this_end and this_end >= end:  # a tie: the later lexicon wins
                    end, alias = this_end, this_alias
            if end:
                found.append(Match(at, end, alias))
                at = end
        return found


def _in_link(text: str, match: Match) -> bool:
    """Whether `match` overlaps a link of `text` (squeezed: its only whitespace is " "). A link
    holds no space, so the run of text between the spaces around the match tells."""
    start = text.rfind(" ", 0, match.start) + 1
    end = text.find(" ", match.end)
    run = text[start : len(text) if end < 0 else end]
    if not any(c in run for c in ".@/"):
        return False
    at, to = match.start - start, match.end - start
    return any(a < to and at < b for a, b in link_spans(run))


def _squeeze(text: str) -> tuple[str, list[Span] | None]:
    """`text` with each run of whitespace one space, and where each of its characters was in
    `text` ([start, end)); None when it is `text` itself."""
    if _UNUSUAL_SPACE.search(text) is None:
        return text, None
    out: list[str] = []
    where: list[Span] = []
    for i, c in enumerate(text):
        if not c.isspace():
            out.append(c)
            where.append((i, i + 1))
        elif out and out[-1] == " ":
            where[-1] = (where[-1][0], i + 1)
        else:
            out.append(" ")
            where.append((i, i + 1))
    return "".join(out), where


def apply_lexicons(lexicons: Lexicons | None, text: Traced) -> Traced:
    """`text` read through `lexicons` (None or none: unchanged)."""
    return lexicons.apply(text) if lexicons else text
