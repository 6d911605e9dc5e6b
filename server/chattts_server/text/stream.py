"""A stream's text front end before the engine: markdown (by default), then the release policy.

    text = StreamText(ReleasePolicy(), markdown=True)
    text.feed("**Turn")          # []
    text.feed(" left.** Then")   # ['Turn left.']

The engine then spells out numbers and symbols (normalize) per utterance. Unary Synthesize
goes through the same two stages (`utterances`), so a text reads the same whichever call sent it.
"""

from __future__ import annotations

import re

from .markdown import MarkdownReader, strip_markdown
from .release import ReleasePolicy, TextReleaser, split_sentences

_HAS_WORD = re.compile(r"[^\W_]")

SENTENCE_END_GRACE_MS = 120
"""A sentence end held by the markdown stage ("Turn left." may yet be "left.md") is released
after this long without a new fragment; a token stream sends its next token sooner."""


class StreamText:
    """Fragments in, utterances out: `MarkdownReader` (unless plain) then `TextReleaser`.

    Like the releaser it has no clock: the caller asks `quiet_deadline_ms` when to call
    `on_quiet` if no fragment arrives."""

    def __init__(self, policy: ReleasePolicy, markdown: bool = True) -> None:
        self.policy = policy
        self._markdown = MarkdownReader() if markdown else None
        self._releaser = TextReleaser(policy)

    def quiet_deadline_ms(self) -> int | None:
        """After how many quiet milliseconds `on_quiet` would release something; None: never."""
        md = self._markdown
        if md is not None and md.holds_sentence_end:
            return SENTENCE_END_GRACE_MS
        held = self._releaser.idle_pending or (md is not None and md.pending)
        return self.policy.idle_ms if held and self.policy.idle_ms > 0 else None

    def on_quiet(self, quiet_ms: float) -> list[str]:
        """No fragment for `quiet_ms`: release a held sentence end, or everything once idle."""
        quiet_ms += 2  # timers may fire a little early
        if self.policy.idle_ms > 0 and quiet_ms >= self.policy.idle_ms:
            return self.flush()
        md = self._markdown
        if md is not None and md.holds_sentence_end and quiet_ms >= SENTENCE_END_GRACE_MS:
            return _with_words(self._releaser.feed(md.flush()))
        return []

    def feed(self, fragment: str) -> list[str]:
        if self._markdown is not None:
            fragment = self._markdown.feed(fragment)
        return _with_words(self._releaser.feed(fragment)) if fragment else []

    def flush(self) -> list[str]:
        """Release everything buffered, marker or boundary or not."""
        held = self._markdown.flush() if self._markdown is not None else ""
        return _with_words(self._releaser.feed(held) + self._releaser.flush())

    def clear(self) -> None:
        """Barge-in: drop what is buffered; the next utterance counts as a first one."""
        if self._markdown is not None:
            self._markdown.clear()
        self._releaser.clear()


def utterances(text: str, max_s: float, speed: int, markdown: bool = True) -> list[str]:
    """A whole text (unary Synthesize) as utterances: markdown removed, then split at sentence
    ends and, where too long, at clause boundaries."""
    if markdown:
        text = strip_markdown(text)
    return _with_words(split_sentences(text, max_s, speed))


def _with_words(utterances: list[str]) -> list[str]:
    """Utterances with something to say: an emoji or a stray mark alone is no utterance."""
    return [u for u in utterances if _HAS_WORD.search(u)]
