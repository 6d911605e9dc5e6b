"""When buffered text is released for synthesis: the text release policy of StreamingSynthesize.

Clients stream text in fragments: tokens of an LLM (fast, punctuated) or words of a live
caption (one every 100-300 ms, often without any punctuation). Text is released, i.e. becomes
an utterance to speak, at the first of:

- a sentence end (. ! ? ; and CJK 。！？；… or a newline), as soon as it arrives;
- a clause boundary (, : and CJK ，、：) once the clause holds `clause_min_words` words;
- `max_words` complete words buffered without either (cut at a clause boundary in the second
  half if there is one, else after the last of those words);
- `idle_ms` without a new fragment (the reader's timer calls `flush`);
- an explicit flush or the end of the stream.

The stream's first utterance is released sooner, so speech starts early: at the first clause
boundary, or once `first_words` words are buffered. Later ones are longer, which sounds more
natural. A CJK character counts as a word. Every released utterance is then cut at clause
boundaries into pieces whose estimated speech fits the per-utterance token cap
(`duration.duration_pieces`), so no utterance ends mid-word at the cap.

Inline control tokens (`[uv_break]`) are never split, a period inside one is no sentence end,
"3." at the end of the buffer waits: it may become "3.5", and so does a title's period ("toward
St." may go on "Louis"; "St. Louis" and "Dr. Smith" are no sentence ends).

Each released utterance can come traced to the caller's text (`feed_traced`,
`split_sentences_traced`, text/spans.py): cuts and squeezed whitespace keep every word's span.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import duration
from .duration import duration_pieces
from .script import CJK_CHARS
from .spans import EMPTY, Traced

_ASCII_END = re.compile(r"[.!?;]+[\"')\]]*(?=\s|$)")
_DECIMAL_PENDING = re.compile(r"\d\.$")
# "St. Louis", "Dr. Smith": a title's period before a name is no sentence end; at the end of
# the buffer it waits, as "3." does, for the name that may follow. "Elm St. then": a street
# word's period before a lowercase word is none either.
_TITLE_PERIOD = re.compile(
    r"\b(?:St|Dr|Mt|Mr|Mrs|Ms)\.(?=\s+[A-Z]|\s*$)"
    r"|\b(?:St|Dr|Ave|Rd|Blvd|Ln|Hwy|Pkwy|Ct|Pl)\.(?=\s+[a-z])"
)
_CJK_END = re.compile(r"[。！？；…]+[”’」』）]*")
_NEWLINE = re.compile(r"\n+")
# An ASCII comma or colon only when a space follows ("1,000" and "10:30" are no boundaries).
_CLAUSE = re.compile(r"[,:]+[\"')\]]*(?=\s)|\s[-–—]+(?=\s)|[，、：]+[”’」』）]*")
_CONTROL_TOKEN = re.compile(r"\[[a-z_]+(?:_\d+)?\]")
_WORD = re.compile(rf"[{CJK_CHARS}]|[^\s{CJK_CHARS}]+")


@dataclass(frozen=True)
class ReleasePolicy:
    """When a stream's buffered text is released; see the module docstring. 0 turns a rule off."""

    clause_min_words: int = 8
    """Release at a clause boundary once the clause holds at least this many words."""
    max_words: int = 20
    """Release once this many complete words are buffered without a boundary."""
    idle_ms: int = 600
    """Release everything buffered when no fragment arrived for this long."""
    first_words: int = 4
    """The first utterance: released at the first clause boundary or at this many words."""
    max_segment_s: float = duration.max_segment_s(768)
    """Longest estimated speech of one utterance (from the per-utterance token cap)."""
    speed: int = 5
    """The stream's `[speed_N]` level, for the duration estimate."""

    MAX_WORDS = 200
    MAX_IDLE_MS = 60_000

    def check(self) -> None:
        """ValueError naming the first field out of range."""
        for name in ("clause_min_words", "max_words", "first_words"):
            if not 0 <= getattr(self, name) <= self.MAX_WORDS:
                raise ValueError(f"{name} must be in [0, {self.MAX_WORDS}]")
        if not 0 <= self.idle_ms <= self.MAX_IDLE_MS:
            raise ValueError(f"idle_ms must be in [0, {self.MAX_IDLE_MS}]")


_NON_SPACE = re.compile(r"\S+")


def _clean(text: Traced) -> Traced:
    """`" ".join(text.split())`: whitespace runs squeezed to one space, ends stripped."""
    return Traced.join(" ", (text[m.start() : m.end()] for m in _NON_SPACE.finditer(text.text)))


def _protected(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _CONTROL_TOKEN.finditer(text)]


def _sentence_ends(text: str) -> list[int]:
    """Offsets just after each sentence end in text, skipping ends inside control tokens."""
    protected = _protected(text)
    titles = {m.end() for m in _TITLE_PERIOD.finditer(text)}
    points = set()
    for pattern in (_ASCII_END, _CJK_END, _NEWLINE):
        for m in pattern.finditer(text):
            if any(a <= m.start() < b for a, b in protected):
                continue
            if pattern is _ASCII_END and m.end() in titles:
                continue
            if m.end() == len(text) and _DECIMAL_PENDING.search(text):
                continue
            points.add(m.end())
    return sorted(points)


def _clause_ends(text: str) -> list[int]:
    protected = _protected(text)
    return [
        m.end() for m in _CLAUSE.finditer(text) if not any(a <= m.start() < b for a, b in protected)
    ]


def _words(text: str) -> list[re.Match[str]]:
    """Words of text, control tokens left out; a CJK character is a word."""
    return [m for m in _WORD.finditer(text) if not _CONTROL_TOKEN.fullmatch(m.group())]


def count_words(text: str) -> int:
    return len(_words(text))


class TextReleaser:
    """Buffers a stream's text fragments and releases utterances by a ReleasePolicy.

    `feed`, `flush` and `clear` are plain calls with no clock: the caller runs the idle timer
    and calls `flush` when it fires (see `idle_pending`)."""

    def __init__(self, policy: ReleasePolicy | None = None) -> None:
        self.policy = policy or ReleasePolicy()
        self._pending = EMPTY
        self._first = True
        self._num_fed = 0
        """Characters given to `feed` so far: what its spans count."""

    @property
    def pending(self) -> str:
        return self._pending.text

    @property
    def idle_pending(self) -> bool:
        """True when an idle timeout would release something."""
        return self.policy.idle_ms > 0 and bool(self._pending.text.strip())

    def feed(self, fragment: str) -> list[str]:
        """Add a fragment; return the utterances it releases, in order."""
        offset, self._num_fed = self._num_fed, self._num_fed + len(fragment)
        return [u.text for u in self.feed_traced(Traced.source(fragment, offset))]

    def flush(self) -> list[str]:
        """Release everything buffered, boundary or not."""
        return [u.text for u in self.flush_traced()]

    def feed_traced(self, fragment: Traced) -> list[Traced]:
        """`feed`, each utterance traced to the fragments' own spans (use one of the two)."""
        self._pending += fragment
        out: list[Traced] = []
        start = 0
        for point in _sentence_ends(self._pending.text):
            out += self._release(self._pending[start:point])
            start = point
        self._pending = self._pending[start:]
        while cut := self._threshold_cut(self._pending.text):
            out += self._release(self._pending[:cut])
            self._pending = self._pending[cut:]
        return out + self._release_overlong()

    def flush_traced(self) -> list[Traced]:
        text, self._pending = self._pending, EMPTY
        return self._release(text)

    def clear(self) -> None:
        """Drop buffered text; the next utterance counts as a first one again (barge-in)."""
        self._pending = EMPTY
        self._first = True

    def _release(self, text: Traced) -> list[Traced]:
        text = _clean(text)
        if not text:
            return []
        self._first = False
        return self._pieces(text)

    def _pieces(self, text: Traced) -> list[Traced]:
        """text cut to fit the duration budget (`duration.duration_pieces`)."""
        p = self.policy
        return [text[a:b] for a, b in duration_pieces(text.text, p.max_segment_s, p.speed)]

    def _threshold_cut(self, text: str) -> int:
        """Where a clause or word-count rule cuts the buffer now; 0 if none applies."""
        p = self.policy
        first = self._first and p.first_words > 0
        clause_min = 1 if first else p.clause_min_words
        if clause_min:
            for end in _clause_ends(text):
                if count_words(text[:end]) >= clause_min:
                    return end
        limit = p.first_words if first else p.max_words
        if not limit:
            return 0
        # A Latin word at the very end of the buffer may still grow ("Hel" + "lo").
        complete = [m for m in _words(text) if m.end() < len(text) or not m.group().isascii()]
        if len(complete) < limit:
            return 0
        word_end = complete[limit - 1].end()
        half = [e for e in _clause_ends(text[:word_end]) if count_words(text[:e]) >= limit / 2]
        return half[-1] if half else word_end

    def _release_overlong(self) -> list[Traced]:
        """A buffer past the duration budget (one endless run, or all rules off) is cut now,
        keeping its last piece, which may still grow."""
        pieces = self._pieces(self._pending)
        if len(pieces) <= 1:
            return []
        self._first = False
        self._pending = pieces[-1]
        return pieces[:-1]


def split_sentences(text: str, max_s: float | None = None, speed: int = 5) -> list[str]:
    """Split a complete text into utterances (unary Synthesize): at sentence ends, then by
    duration at clause boundaries. `max_s` defaults to the budget of a 768-token cap."""
    return [u.text for u in split_sentences_traced(Traced.source(text), max_s, speed)]


def split_sentences_traced(
    text: Traced, max_s: float | None = None, speed: int = 5
) -> list[Traced]:
    """`split_sentences`, each utterance traced to the spans of `text`."""
    policy = ReleasePolicy(
        clause_min_words=0,
        max_words=0,
        first_words=0,
        max_segment_s=duration.max_segment_s(768) if max_s is None else max_s,
        speed=speed,
    )
    releaser = TextReleaser(policy)
    return releaser.feed_traced(text) + releaser.flush_traced()
