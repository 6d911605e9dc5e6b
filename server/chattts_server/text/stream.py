"""A stream's text front end before the engine: markdown (by default), then the release policy.

    text = StreamText(ReleasePolicy(), markdown=True)
    text.feed("**Turn")          # []
    text.feed(" left.** Then")   # ['Turn left.']

The engine then spells out numbers and symbols (normalize) per utterance. Unary Synthesize
goes through the same two stages (`utterances`), so a text reads the same whichever call sent it.

The `*_traced` twins release the same utterances as `Utterance`s: the text and, for each of its
characters, the span of the caller's text it came from, in code points of everything the stream
was sent so far (all fragments joined, cleared ones included; a JavaScript client counts UTF-16
units: `spans.utf16_offset`). Markup and the periods markdown adds are in no span. The engine's
normalizer carries the spans on to the spoken words (`TextNormalizer.traced`, text/words.py).
"""

from __future__ import annotations

import re
from typing import TypeAlias

from .markdown import MarkdownReader, strip_markdown_traced
from .release import ReleasePolicy, TextReleaser, split_sentences_traced
from .spans import EMPTY, Traced

_HAS_WORD = re.compile(r"[^\W_]")

SENTENCE_END_GRACE_MS = 120
"""A sentence end held by the markdown stage ("Turn left." may yet be "left.md") is released
after this long without a new fragment; a token stream sends its next token sooner."""

Utterance: TypeAlias = Traced
"""A released utterance: `.text` is what the engine reads, `.spans` where each character of it
came from in the caller's text (`.span()`: the whole utterance's range)."""


class StreamText:
    """Fragments in, utterances out: `MarkdownReader` (unless plain) then `TextReleaser`.

    Like the releaser it has no clock: the caller asks `quiet_deadline_ms` when to call
    `on_quiet` if no fragment arrives."""

    def __init__(self, policy: ReleasePolicy, markdown: bool = True) -> None:
        self.policy = policy
        self._markdown = MarkdownReader() if markdown else None
        self._releaser = TextReleaser(policy)
        self._num_sent = 0
        """Characters of the caller's text so far: where the next fragment's spans start."""

    def quiet_deadline_ms(self) -> int | None:
        """After how many quiet milliseconds `on_quiet` would release something; None: never."""
        md = self._markdown
        if md is not None and md.holds_sentence_end:
            return SENTENCE_END_GRACE_MS
        held = self._releaser.idle_pending or (md is not None and md.pending)
        return self.policy.idle_ms if held and self.policy.idle_ms > 0 else None

    def on_quiet(self, quiet_ms: float) -> list[str]:
        """No fragment for `quiet_ms`: release a held sentence end, or everything once idle."""
        return _texts(self.on_quiet_traced(quiet_ms))

    def feed(self, fragment: str) -> list[str]:
        return _texts(self.feed_traced(fragment))

    def flush(self) -> list[str]:
        """Release everything buffered, marker or boundary or not."""
        return _texts(self.flush_traced())

    def on_quiet_traced(self, quiet_ms: float) -> list[Utterance]:
        quiet_ms += 2  # timers may fire a little early
        if self.policy.idle_ms > 0 and quiet_ms >= self.policy.idle_ms:
            return self.flush_traced()
        md = self._markdown
        if md is not None and md.holds_sentence_end and quiet_ms >= SENTENCE_END_GRACE_MS:
            return _with_words(self._releaser.feed_traced(md.flush_traced()))
        return []

    def feed_traced(self, fragment: str) -> list[Utterance]:
        traced = Traced.source(fragment, self._num_sent)
        self._num_sent += len(fragment)
        if self._markdown is not None:
            traced = self._markdown.feed_traced(traced)
        return _with_words(self._releaser.feed_traced(traced)) if traced else []

    def flush_traced(self) -> list[Utterance]:
        held = self._markdown.flush_traced() if self._markdown is not None else EMPTY
        return _with_words(self._releaser.feed_traced(held) + self._releaser.flush_traced())

    def clear(self) -> None:
        """Barge-in: drop what is buffered; the next utterance counts as a first one. Spans go
        on counting the cleared text: they index everything the caller sent."""
        if self._markdown is not None:
            self._markdown.clear()
        self._releaser.clear()


def utterances(text: str, max_s: float, speed: int, markdown: bool = True) -> list[str]:
    """A whole text (unary Synthesize) as utterances: markdown removed, then split at sentence
    ends and, where too long, at clause boundaries."""
    return _texts(utterances_traced(text, max_s, speed, markdown))


def utterances_traced(
    text: str, max_s: float, speed: int, markdown: bool = True
) -> list[Utterance]:
    """`utterances`, each traced to `text`."""
    traced = strip_markdown_traced(text) if markdown else Traced.source(text)
    return _with_words(split_sentences_traced(traced, max_s, speed))


def _with_words(utterances: list[Utterance]) -> list[Utterance]:
    """Utterances with something to say: an emoji or a stray mark alone is no utterance."""
    return [u for u in utterances if _HAS_WORD.search(u.text)]


def _texts(utterances: list[Utterance]) -> list[str]:
    return [u.text for u in utterances]
