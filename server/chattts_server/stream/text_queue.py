"""A stream's text side: each valid text message turned into queued stream items.

`TextQueue.apply` takes one `TextFragment` (already validated) and does, in order: a clear
(barge-in), then a replace or the message's text (a `segment` first closing what came before),
then the flush a flush or a mark asks for, then the mark. It owns the stream's text front end
(`TextFrontEnd`: markdown, plain or SSML, then the release policy), its segments
(stream/segments.py) and the queue of items not yet spoken (`pending`), which a clear or a
replace rewrites:

    clear     the queued utterances and silences go; the queued marks come back as dropped and
              the queued segment ends as NOT_SPOKEN (CUT for the one speaking), in order.
    replace   a segment not started: its queued utterances go, it ends REPLACED, and the new
              text takes its place in the queue; one speaking: FINISH puts the new text right
              after it, CUT also takes its queued utterances off and stops it at the next word
              boundary, DROP_NEW speaks nothing new (the new revision ends NOT_SPOKEN where the
              one in force ends); one ended (or a new name): the new text is queued at the end.

What the utterance being spoken must do is returned as `Stop`s, which the stream carries out:
this module changes no state but the queue's and the segments'.

Every released utterance gets the time its first character reached the server (`received_at`,
from which its lag and its segment's expiry count) and the segment open when it was released.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque
from dataclasses import dataclass

from ..errors import InvalidRequestError
from ..text import control_tokens
from .items import MarkAt, SegmentDone, Speak, StreamItem
from .segments import IfStarted, Segment, SegmentBook, State
from .settings import StreamSettings
from .ssml_text import SsmlText
from .text_front_end import MarkdownText, TextFrontEnd

TEXT_FIELD = "text.text"
SEGMENT_FIELD = "text.segment"


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
    segment: str = ""
    """Name this message's text (to the next flush, mark, segment or replace); "" for none."""
    replace: str = ""
    """Replace the named segment's text with this message's text; "" for none."""
    if_started: IfStarted = IfStarted.FINISH
    """What a replace does to a segment already speaking."""
    expires_in_ms: int = 0
    """The segment's longest wait for its first audio, from now; 0: no limit."""


@dataclass(frozen=True)
class Stop:
    """What a message asks of the utterance being spoken."""

    reason: str
    """Its finish_reason: "cleared" (a clear), "cut" (a CUT replace), "replaced"."""
    at_word: bool = False
    """At its next word boundary (once it has sent audio), not at once."""
    segment: Segment | None = None
    """Only if the utterance is this segment's; None: whatever is being spoken."""


def front_end(settings: StreamSettings) -> TextFrontEnd:
    """The stream's text front end by its text format: SSML, or markdown / plain text."""
    s = settings
    if s.ssml:
        return SsmlText(
            s.text_release, TEXT_FIELD, s.ssml_ignore_unknown, s.lexicons, s.server_lexicons
        )
    return MarkdownText(s.text_release, s.markdown, s.lexicons)


class _Arrivals:
    """When each part of the caller's text reached the server."""

    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._times: list[float] = []
        self.num_chars = 0

    def add(self, text: str, now: float) -> None:
        if text:
            self._offsets.append(self.num_chars)
            self._times.append(now)
            self.num_chars += len(text)

    def at(self, offset: int) -> float | None:
        k = bisect.bisect_right(self._offsets, offset) - 1
        return self._times[k] if k >= 0 else None


class TextQueue:
    def __init__(self, releaser: TextFrontEnd) -> None:
        self.releaser = releaser
        self.pending: deque[StreamItem] = deque()
        """What is released and not yet spoken, in order."""
        self.book = SegmentBook()
        self.open: Segment | None = None
        """The segment whose text is arriving (to the next flush, mark, segment or replace)."""
        self._arrivals = _Arrivals()

    # -- messages ----------------------------------------------------------------------------

    def apply(self, fragment: TextFragment, now: float) -> list[Stop]:
        """One valid message, received at `now` (time.monotonic())."""
        stops = [self._clear()] if fragment.clear else []
        self._arrivals.add(fragment.text, now)
        if fragment.replace:
            self._close()
            stops += self._replace(fragment, now)
        else:
            if fragment.segment:
                self._close()
                self.open = self.book.begin(
                    fragment.segment, now, fragment.expires_in_ms, SEGMENT_FIELD
                )
            if self.open is not None:
                self.open.text += fragment.text
            self.pending += self._tagged(self.releaser.feed(fragment.text))
            if fragment.flush or fragment.mark:
                self._close()
        if fragment.mark:
            self.pending.append(MarkAt(fragment.mark))
        return stops

    def on_quiet(self, quiet_ms: float) -> None:
        self.pending += self._tagged(self.releaser.on_quiet(quiet_ms))

    def end(self) -> None:
        """The text is over: everything left, the open segment closed."""
        self.pending += self._tagged(self.releaser.end())
        self._close()

    # -- inside ------------------------------------------------------------------------------

    def _close(self) -> None:
        """Release what is buffered; the open segment (if any) ends here."""
        self.pending += self._tagged(self.releaser.flush())
        if self.open is not None:
            self.pending.append(SegmentDone(self.open))
            self.open = None

    def _tagged(self, items: list[StreamItem], segment: Segment | None = None) -> list[StreamItem]:
        """Released items with their segment and arrival; a control token completed across
        fragments is refused here."""
        segment = segment or self.open
        out: list[StreamItem] = []
        for item in items:
            if isinstance(item, Speak):
                try:
                    control_tokens.check(item.text.text)
                except ValueError as exc:
                    raise InvalidRequestError(TEXT_FIELD, str(exc)) from None
                span = item.text.span()
                received = self._arrivals.at(span[0]) if span is not None else None
                item = dataclasses.replace(item, segment=segment, received_at=received)
            out.append(item)
        return out

    def _replace(self, fragment: TextFragment, now: float) -> list[Stop]:
        name = fragment.replace
        old = self.book.in_force(name)
        new = self.book.revise(name, now, fragment.expires_in_ms)
        new.text = fragment.text
        released = self.releaser.feed(fragment.text) + self.releaser.flush()
        items = self._tagged(released, new) + [SegmentDone(new)]
        stops: list[Stop] = []
        if old is not None and old.state is State.SPEAKING:
            if fragment.if_started is IfStarted.DROP_NEW:
                new.end(State.NOT_SPOKEN)
                items = [SegmentDone(new)]
                self.book.keep(old)
            elif fragment.if_started is IfStarted.CUT:
                self._unqueue(old)
                old.end(State.CUT)
                stops.append(Stop("cut", at_word=True, segment=old))
        elif old is not None and old.open:  # not started: none of it is ever spoken
            self._unqueue(old)
            if old.state is State.TAKEN:
                stops.append(Stop("replaced", segment=old))
            old.end(State.REPLACED)
        self._insert_after(name, items)
        return stops

    def _clear(self) -> Stop:
        """Barge-in: drop what is buffered and queued (see the module's docstring)."""
        self.releaser.clear()
        kept: list[StreamItem] = []
        for item in self.pending:
            if isinstance(item, MarkAt):
                kept.append(MarkAt(item.name, dropped=True))
            elif isinstance(item, SegmentDone):
                _end_cleared(item.segment)
                kept.append(item)
        if self.open is not None:
            _end_cleared(self.open)
            kept.append(SegmentDone(self.open))
            self.open = None
        self.pending = deque(kept)
        return Stop("cleared")

    def _unqueue(self, segment: Segment) -> None:
        """Take `segment`'s queued utterances off the queue."""
        self.pending = deque(
            i for i in self.pending if not (isinstance(i, Speak) and i.segment is segment)
        )

    def _insert_after(self, name: str, new: list[StreamItem]) -> None:
        """Queue `new` right after the last queued end of a revision of `name`, else at the
        end: a revision ends after those before it, refused ones included."""
        items = list(self.pending)
        at = len(items)
        for k, item in enumerate(items):
            if isinstance(item, SegmentDone) and item.segment.name == name:
                at = k + 1
        self.pending = deque(items[:at] + new + items[at:])


def _end_cleared(segment: Segment) -> None:
    """A clear: a segment speaking is cut (the stream stops it), one not started is never
    spoken."""
    segment.end(State.CUT if segment.state is State.SPEAKING else State.NOT_SPOKEN)
