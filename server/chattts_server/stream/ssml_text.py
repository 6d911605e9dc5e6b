"""SSML documents as stream items: the SSML reader beside the text reader's markdown and plain.

`SsmlText` is the streamed form (one document over a stream's `TextInput`s), `ssml_stream_items`
the whole one (Synthesize, POST). Both turn text/ssml's items into the timeline's
(stream/items.py): an utterance is a `Speak` at its own speed, a `<break>` a `Silence`
written into the audio, a `<mark>` a `MarkAt` answered with a Mark event. Each `Speak` carries
the caller's own text of it, cut from the document, and is read through the stream's lexicons
and then those its document named (`<lexicon uri>`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..text.lexicon import Lexicons, apply_lexicons
from ..text.lexicon_library import LexiconLibrary
from ..text.release import ReleasePolicy
from ..text.spans import Span, Traced
from ..text.ssml import Break, Item, MarkPart, SpeechItem, SsmlStream, ssml_items
from .items import MarkAt, Silence, Speak, StreamItem
from .text_front_end import CallerText


class SsmlText:
    """A stream's SSML, fragment by fragment, as stream items (no clock: see `StreamText`)."""

    def __init__(
        self,
        policy: ReleasePolicy,
        field_name: str,
        ignore_unknown: bool,
        lexicons: Lexicons | None = None,
        server_lexicons: LexiconLibrary | None = None,
    ) -> None:
        """`lexicons`: what every utterance is read through; `server_lexicons`: those a
        document's `<lexicon uri>` may name."""
        self._ssml = SsmlStream(policy, field_name, ignore_unknown, server_lexicons)
        self._caller = CallerText()
        self._lexicons = lexicons

    def quiet_deadline_ms(self) -> int | None:
        return self._ssml.quiet_deadline_ms()

    def on_quiet(self, quiet_ms: float) -> list[StreamItem]:
        return self._stream_items(self._ssml.on_quiet(quiet_ms))

    def feed(self, fragment: str) -> list[StreamItem]:
        self._caller.append(fragment)
        return self._stream_items(self._ssml.feed(fragment))

    def flush(self) -> list[StreamItem]:
        return self._stream_items(self._ssml.flush())

    def end(self) -> list[StreamItem]:
        """The stream is over: InvalidRequestError if its document is not complete."""
        return self._stream_items(self._ssml.end())

    def clear(self) -> None:
        """Barge-in: drop what is buffered; the text after it is a new document."""
        self._ssml.clear()

    def _stream_items(self, items: list[Item]) -> list[StreamItem]:
        return [stream_item(item, self._caller.cut, self._lexicons) for item in items]


def stream_item(
    item: Item, cut: Callable[[Span | None], str], lexicons: Lexicons | None = None
) -> StreamItem:
    """One text/ssml item as the timeline's; a `Speak` with its own text `cut` from what the
    caller sent, read through `lexicons` and its document's."""
    if isinstance(item, SpeechItem):
        return Speak(_read(item, lexicons), cut(item.text.span()), speed=item.speed)
    if isinstance(item, Break):
        return Silence(item.duration_s)
    assert isinstance(item, MarkPart)
    return MarkAt(item.name)


def _read(item: SpeechItem, lexicons: Lexicons | None) -> Traced:
    if item.lexicons:
        lexicons = (lexicons or Lexicons(())) + item.lexicons
    return apply_lexicons(lexicons, item.text)


def ssml_stream_items(
    document: str,
    max_s: float,
    speed: int,
    ignore_unknown: bool,
    field_name: str,
    lexicons: Lexicons | None = None,
    server_lexicons: LexiconLibrary | None = None,
) -> list[StreamItem]:
    """A whole document as stream items (InvalidRequestError naming `field_name`, the line,
    the column and the element when it is not one), read as `SsmlText` reads them."""
    items = ssml_items(document, max_s, speed, ignore_unknown, field_name, server_lexicons)
    return [
        stream_item(item, lambda span: document[span[0] : span[1]] if span else "", lexicons)
        for item in items
    ]
