"""A stream's text front end as the reader sees it: fragments in, the timeline's items out.

Two fill `TextFrontEnd`: `MarkdownText` (markdown or plain text through text/stream.py's
`StreamText`) and `SsmlText` (stream/ssml_text.py: SSML documents). Each `Speak` carries the
caller's own text of it, cut from everything the stream was sent (`CallerText`), and is read
through the stream's pronunciation lexicons (text/lexicon.py).
"""

from __future__ import annotations

import bisect
from typing import Protocol

from ..text.lexicon import Lexicons, apply_lexicons
from ..text.release import ReleasePolicy
from ..text.spans import Span
from ..text.stream import StreamText, Utterance
from .items import Speak, StreamItem


class TextFrontEnd(Protocol):
    """No clock: the reader asks `quiet_deadline_ms` when to call `on_quiet`."""

    def quiet_deadline_ms(self) -> int | None: ...

    def on_quiet(self, quiet_ms: float) -> list[StreamItem]: ...

    def feed(self, fragment: str) -> list[StreamItem]: ...

    def flush(self) -> list[StreamItem]:
        """Release what is buffered (TextInput.flush, a mark)."""
        ...

    def end(self) -> list[StreamItem]:
        """The text is over: everything left (InvalidRequestError if it cannot be read)."""
        ...

    def clear(self) -> None:
        """Barge-in: drop what is buffered."""
        ...


class CallerText:
    """Everything the caller sent on a stream, to cut the utterances' own text from."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._starts: list[int] = []
        self.num_chars = 0

    def append(self, fragment: str) -> None:
        if fragment:
            self._starts.append(self.num_chars)
            self._parts.append(fragment)
            self.num_chars += len(fragment)

    def cut(self, span: Span | None) -> str:
        """The caller's text [start, end); "" for None."""
        if span is None:
            return ""
        start, end = span
        out: list[str] = []
        k = max(0, bisect.bisect_right(self._starts, start) - 1)
        while k < len(self._parts) and self._starts[k] < end:
            at = self._starts[k]
            out.append(self._parts[k][max(0, start - at) : end - at])
            k += 1
        return "".join(out)

    def speak(self, utterance: Utterance, lexicons: Lexicons | None = None) -> Speak:
        """The utterance read through `lexicons`, with its caller's text."""
        return Speak(apply_lexicons(lexicons, utterance), self.cut(utterance.span()))


class MarkdownText:
    """Markdown or plain text (`StreamText`) as stream items."""

    def __init__(
        self, policy: ReleasePolicy, markdown: bool, lexicons: Lexicons | None = None
    ) -> None:
        self._text = StreamText(policy, markdown)
        self._caller = CallerText()
        self._lexicons = lexicons

    def quiet_deadline_ms(self) -> int | None:
        return self._text.quiet_deadline_ms()

    def on_quiet(self, quiet_ms: float) -> list[StreamItem]:
        return self._speak(self._text.on_quiet_traced(quiet_ms))

    def feed(self, fragment: str) -> list[StreamItem]:
        self._caller.append(fragment)
        return self._speak(self._text.feed_traced(fragment))

    def flush(self) -> list[StreamItem]:
        return self._speak(self._text.flush_traced())

    def end(self) -> list[StreamItem]:
        return self.flush()

    def clear(self) -> None:
        self._text.clear()

    def _speak(self, utterances: list[Utterance]) -> list[StreamItem]:
        return [self._caller.speak(u, self._lexicons) for u in utterances]
