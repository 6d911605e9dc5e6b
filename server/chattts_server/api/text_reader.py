"""The reading side of a text stream: text fragments in, utterances to speak out.

`read_text` reads a stream's `TextFragment`s after its config (the gRPC servicer converts
`StreamingSynthesizeRequest`s, the WebSocket its JSON messages), validates each fragment, feeds
it to the stream's text front end (api/text_front_end.py: markdown or plain text, or an SSML
document, then the release policy) and puts every stream item it releases on the queue the
speaking side drains. A whitespace-only fragment is
text like any other (LLMs emit `" "` and `"\n\n"` tokens): spaces separate words, a newline
ends a sentence; an empty one is a no-op. It also wakes without a new message: when text is
buffered and `idle_ms` pass with no message, the buffer is released (a caption reader pauses,
an LLM stalls on a tool call), and a sentence end held by the markdown stage is released after
a short quiet spell. One read of the request stream is kept pending across those wake-ups,
because cancelling a read would end the request iterator.

Marks: a fragment's `mark` ends the text before it as a flush does, so it always falls between
utterances, and is queued after them (`MarkAt`). A clear drops the queued utterances and
silences and re-queues the queued marks as dropped, in order: the speaking side answers them
after the cut utterance's end, at the cut. A mark riding with clear is placed after the cut.

Queue protocol (`UtteranceQueue`): stream items (api/stream_items.py: `Speak`, `MarkAt`,
`Silence`, in order), then exactly one of `EndOfText` (the client half-closed, or the door saw
it go away) or the exception the reading ended with (an InvalidRequestError: the stream ends
INVALID_ARGUMENT naming the field; anything else ends it with that failure too, never as a
normal end of text).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..errors import InvalidRequestError
from ..text import control_tokens
from .convert import StreamSettings, Validator
from .ssml_text import SsmlText
from .stream_items import MarkAt, Speak, StreamItem, check_mark_name
from .text_front_end import MarkdownText, TextFrontEnd

_TEXT_FIELD = "text.text"
_MARK_FIELD = "text.mark"


@dataclass(frozen=True)
class EndOfText:
    """The text is over (half-close, or the client went away): speak what is queued, end."""


UtteranceQueue = asyncio.Queue[StreamItem | BaseException | EndOfText]
"""Stream items from `read_text` to the speaking side."""


@dataclass(frozen=True)
class TextFragment:
    """One text message of a stream, whatever the transport (gRPC `TextInput`, WebSocket JSON)."""

    text: str = ""
    """UTF-8 text, any part of a sentence; whitespace only and empty are valid."""
    flush: bool = False
    """Speak everything buffered now."""
    clear: bool = False
    """Barge-in: drop what is buffered and queued, stop the utterance being spoken."""
    mark: str = ""
    """A name placed after this fragment's text (which it flushes); "" for none."""


def front_end(settings: StreamSettings) -> TextFrontEnd:
    """The stream's text front end by its text format: SSML, or markdown / plain text."""
    if settings.ssml:
        return SsmlText(settings.text_release, _TEXT_FIELD, settings.ssml_ignore_unknown)
    return MarkdownText(settings.text_release, settings.markdown)


async def read_text(
    fragments: AsyncIterator[TextFragment],
    queue: UtteranceQueue,
    validator: Validator,
    releaser: TextFrontEnd,
    max_stream_chars: int,
    on_clear: Callable[[], None] | None = None,
) -> None:
    """Read text messages into stream items on queue until the request stream ends.

    `releaser` is the stream's text front end (`front_end`: markdown, plain or SSML, then the
    release policy). `on_clear` is called on `TextInput.clear` after the buffered text and the
    queued utterances are dropped (it stops the utterance being spoken)."""
    iterator = aiter(fragments)
    next_message: asyncio.Future[TextFragment] | None = None
    last_message_at = time.monotonic()
    total_chars = 0

    try:
        while True:
            if next_message is None:
                next_message = asyncio.ensure_future(anext(iterator))
            timeout_s = None
            quiet_ms = releaser.quiet_deadline_ms()
            if quiet_ms is not None:
                timeout_s = max(0.0, last_message_at + quiet_ms / 1000 - time.monotonic())
            done, _ = await asyncio.wait({next_message}, timeout=timeout_s)
            if not done:
                # idle: speak what is buffered (or a held sentence end)
                _put(queue, releaser.on_quiet((time.monotonic() - last_message_at) * 1000))
                continue
            try:
                text_input = next_message.result()
            except StopAsyncIteration:
                break
            next_message = None
            last_message_at = time.monotonic()
            total_chars += len(text_input.text)
            _check_fragment(text_input, validator, total_chars, max_stream_chars)
            _apply(text_input, releaser, queue, on_clear)
        _put(queue, releaser.end())
        queue.put_nowait(EndOfText())
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bad fragment (InvalidRequestError), or the source failed
        queue.put_nowait(exc)
    finally:
        if next_message is not None:
            if not next_message.done():
                next_message.cancel()
            elif not next_message.cancelled():
                next_message.exception()  # retrieved: asyncio would log it at collection


def _check_fragment(
    fragment: TextFragment, validator: Validator, total_chars: int, max_stream_chars: int
) -> None:
    """InvalidRequestError for a bad text or mark name, or once the stream's text passes
    `max_stream_chars` (`total_chars` counts this fragment)."""
    validator.text(fragment.text, _TEXT_FIELD, allow_empty=True)
    if fragment.mark and (why := check_mark_name(fragment.mark)) is not None:
        raise InvalidRequestError(_MARK_FIELD, why)
    if total_chars > max_stream_chars:
        raise InvalidRequestError(
            _TEXT_FIELD, f"the stream sent over {max_stream_chars} characters in total"
        )


def _apply(
    fragment: TextFragment,
    releaser: TextFrontEnd,
    queue: UtteranceQueue,
    on_clear: Callable[[], None] | None,
) -> None:
    """One valid fragment: a clear first (so its text and mark land after the cut), then the
    text, then the flush that a flush or a mark asks for, then the mark."""
    if fragment.clear:
        releaser.clear()
        _drop_queued_items(queue)
        if on_clear is not None:
            on_clear()
    _put(queue, releaser.feed(fragment.text))
    if fragment.flush or fragment.mark:
        _put(queue, releaser.flush())
    if fragment.mark:
        queue.put_nowait(MarkAt(fragment.mark))


def _put(queue: UtteranceQueue, items: list[StreamItem]) -> None:
    """Queue released items; a control token completed across fragments is refused here."""
    for item in items:
        if isinstance(item, Speak):
            try:
                control_tokens.check(item.text.text)
            except ValueError as exc:
                raise InvalidRequestError(_TEXT_FIELD, str(exc)) from None
        queue.put_nowait(item)


def _drop_queued_items(queue: UtteranceQueue) -> None:
    """Remove what the speaking side has not taken yet; its marks go back, in order, as dropped
    (only stream items are queued before the end marker, so nothing else is lost)."""
    marks: list[MarkAt] = []
    while True:
        try:
            item = queue.get_nowait()
        except asyncio.QueueEmpty:
            break
        if isinstance(item, MarkAt):
            marks.append(MarkAt(item.name, dropped=True))
    for mark in marks:
        queue.put_nowait(mark)
