"""The reading side of a text stream: text messages in, posted to the stream's inbox.

`read_text` reads a stream's `TextFragment`s after its config (the gRPC servicer converts
`StreamingSynthesizeRequest`s, the WebSocket its JSON messages), validates each one and posts
it with the time it reached the server on the stream's inbox. It changes no stream state: the
stream (stream/stream.py) takes each message from the inbox and applies it. The reader starts
before the stream is admitted, so each message's time of arrival is known while the stream
waits (a segment's expiry and an utterance's lag count from it).

A whitespace-only fragment is text like any other (LLMs emit `" "` and `"\n\n"` tokens); an
empty one is a no-op.

Inbox protocol (`Inbox`): `Received` messages in order, then exactly one of `EndOfText` (the
client half-closed, or the door saw it go away) or the exception the reading ended with (an
InvalidRequestError: the stream ends INVALID_ARGUMENT naming the field once what came before
it is spoken; anything else ends it with that failure too, never as a normal end of text).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from ..errors import InvalidRequestError
from .segments import check_expires_ms, check_name, check_segment_name
from .text_queue import TEXT_FIELD, TextFragment

__all__ = ["EndOfText", "Inbox", "Received", "TextFragment", "read_text"]

_MARK_FIELD = "text.mark"


class TextCheck(Protocol):
    """What the reader needs of the request validator (api/convert.py `Validator`)."""

    def text(self, text: str, field_name: str, allow_empty: bool = False) -> str:
        """`text` if it is valid; InvalidRequestError naming `field_name` if not."""
        ...


@dataclass(frozen=True)
class EndOfText:
    """The text is over (half-close, or the client went away): speak what is queued, end."""


@dataclass(frozen=True)
class Received:
    """A valid text message and when it reached the server (time.monotonic())."""

    fragment: TextFragment
    at: float


Inbox = asyncio.Queue[Received | EndOfText | BaseException]
"""What the reader posts, for the stream to apply."""


async def read_text(
    fragments: AsyncIterator[TextFragment],
    inbox: Inbox,
    validator: TextCheck,
    max_stream_chars: int,
) -> None:
    """Post every valid text message on `inbox` until the request stream ends."""
    total_chars = 0
    try:
        async for fragment in fragments:
            now = time.monotonic()
            total_chars += len(fragment.text)
            _check_fragment(fragment, validator, total_chars, max_stream_chars)
            inbox.put_nowait(Received(fragment, now))
        inbox.put_nowait(EndOfText())
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bad fragment (InvalidRequestError), or the source failed
        inbox.put_nowait(exc)


def _check_fragment(
    fragment: TextFragment, validator: TextCheck, total_chars: int, max_stream_chars: int
) -> None:
    """InvalidRequestError for a bad text or mark name, or once the stream's text passes
    `max_stream_chars` (`total_chars` counts this fragment)."""
    validator.text(fragment.text, TEXT_FIELD, allow_empty=True)
    if fragment.mark and (why := check_name(fragment.mark)) is not None:
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
            TEXT_FIELD, f"the stream sent over {max_stream_chars} characters in total"
        )
