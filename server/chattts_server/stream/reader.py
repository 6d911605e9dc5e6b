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

Each valid fragment goes to the stream's `TextQueue` (api/text_queue.py): marks, clears,
named segments and replaces are turned into stream items and queue rewrites there. A mark ends
the text before it as a flush does, so it always falls between utterances (`MarkAt`); a clear
drops the queued utterances and re-queues the marks as dropped, in order. The reader starts
before the stream is admitted, so each message's time of arrival is known while the stream
waits (a segment's expiry and an utterance's lag count from it).

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

from ..api.convert import StreamSettings, Validator
from ..api.ssml_text import SsmlText
from ..api.text_front_end import MarkdownText, TextFrontEnd
from ..errors import InvalidRequestError
from .items import StreamItem, check_mark_name
from .segments import check_expires_ms, check_segment_name
from .text_queue import TEXT_FIELD, SpeakingControl, TextFragment, TextQueue

__all__ = ["EndOfText", "TextFragment", "UtteranceQueue", "front_end", "read_text"]

_TEXT_FIELD = TEXT_FIELD
_MARK_FIELD = "text.mark"


@dataclass(frozen=True)
class EndOfText:
    """The text is over (half-close, or the client went away): speak what is queued, end."""


UtteranceQueue = asyncio.Queue[StreamItem | BaseException | EndOfText]
"""Stream items from `read_text` to the speaking side."""


def front_end(settings: StreamSettings) -> TextFrontEnd:
    """The stream's text front end by its text format: SSML, or markdown / plain text."""
    s = settings
    if s.ssml:
        return SsmlText(
            s.text_release, _TEXT_FIELD, s.ssml_ignore_unknown, s.lexicons, s.server_lexicons
        )
    return MarkdownText(s.text_release, s.markdown, s.lexicons)


async def read_text(
    fragments: AsyncIterator[TextFragment],
    queue: UtteranceQueue,
    validator: Validator,
    releaser: TextFrontEnd,
    max_stream_chars: int,
    speaker: Callable[[], SpeakingControl | None] = lambda: None,
) -> None:
    """Read text messages into stream items on queue until the request stream ends.

    `releaser` is the stream's text front end (`front_end`: markdown, plain or SSML, then the
    release policy). `speaker` gives the speaking side once the stream has one (it may still be
    waiting for admission while its text is read): a clear stops its utterance, a replace may."""
    text_queue = TextQueue(releaser, queue, speaker)
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
                text_queue.on_quiet((time.monotonic() - last_message_at) * 1000)
                continue
            try:
                text_input = next_message.result()
            except StopAsyncIteration:
                break
            next_message = None
            last_message_at = time.monotonic()
            total_chars += len(text_input.text)
            _check_fragment(text_input, validator, total_chars, max_stream_chars)
            text_queue.apply(text_input, last_message_at)
        text_queue.end()
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
    if fragment.segment or fragment.replace:
        if fragment.segment and fragment.replace:
            raise InvalidRequestError(
                "text.replace", "a message names a new segment or replaces one, not both"
            )
        field_name = "text.segment" if fragment.segment else "text.replace"
        check_segment_name(fragment.segment or fragment.replace, field_name)
    elif fragment.expires_in_ms:
        raise InvalidRequestError(
            "text.expires_in_ms", "applies to a segment: send it with `segment` or `replace`"
        )
    check_expires_ms(fragment.expires_in_ms, "text.expires_in_ms")
    if total_chars > max_stream_chars:
        raise InvalidRequestError(
            _TEXT_FIELD, f"the stream sent over {max_stream_chars} characters in total"
        )
