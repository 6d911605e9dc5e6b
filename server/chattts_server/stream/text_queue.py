"""The reader's side of a stream's queue: each valid text message turned into queued stream items.

`TextQueue.apply` takes one `TextFragment` (already validated) and does, in order: a clear
(barge-in), then a replace or the message's text (a `segment` first closing what came before),
then the flush a flush or a mark asks for, then the mark. It owns the stream's text front end
(`TextFrontEnd`: markdown, plain or SSML, then the release policy) and its segments
(api/segments.py), and it rewrites the queue the speaking side drains where a clear or a replace
says so:

    clear     the queued utterances and silences go; the queued marks come back as dropped and
              the queued segment ends as NOT_SPOKEN (CUT for the one speaking), in order.
    replace   a segment not started: its queued utterances go, it ends REPLACED, and the new
              text takes its place in the queue; one speaking: FINISH puts the new text right
              after it, CUT also takes its queued utterances off and has the speaking side stop
              it at the next word boundary, DROP_NEW speaks nothing new (the new revision ends
              NOT_SPOKEN); one ended (or a new name): the new text is queued at the end.

Every released utterance gets the time its first character reached the server (`received_at`,
from which its lag and its segment's expiry count) and the segment open when it was released.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..api.text_front_end import TextFrontEnd
from ..errors import InvalidRequestError
from ..text import control_tokens
from .items import MarkAt, SegmentDone, Speak, StreamItem
from .segments import IfStarted, Outcome, Segment, SegmentBook, State

if TYPE_CHECKING:
    from .reader import EndOfText

    UtteranceQueue = asyncio.Queue[StreamItem | BaseException | EndOfText]

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


class SpeakingControl(Protocol):
    """What the reader may ask of the speaking side (`Session`)."""

    def interrupt(self) -> None:
        """Barge-in: stop the utterance being spoken now."""
        ...

    def stop_segment(self, segment: Segment, at_word: bool) -> None:
        """Stop the utterance being spoken if it is `segment`'s: at the next word boundary
        (`at_word`, a CUT) or at once (it has sent no audio)."""
        ...


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
    def __init__(
        self,
        releaser: TextFrontEnd,
        queue: UtteranceQueue,
        speaker: Callable[[], SpeakingControl | None] = lambda: None,
    ) -> None:
        self.releaser = releaser
        self.queue = queue
        self._speaker = speaker
        """The speaking side, once there is one (the stream may still wait for admission)."""
        self.book = SegmentBook()
        self.open: Segment | None = None
        """The segment whose text is arriving (to the next flush, mark, segment or replace)."""
        self._arrivals = _Arrivals()

    # -- messages ----------------------------------------------------------------------------

    def apply(self, fragment: TextFragment, now: float) -> None:
        """One valid message, received at `now` (time.monotonic())."""
        if fragment.clear:
            self._clear()
        self._arrivals.add(fragment.text, now)
        if fragment.replace:
            self._close()
            self._replace(fragment, now)
        else:
            if fragment.segment:
                self._close()
                self.open = self.book.begin(
                    fragment.segment, now, fragment.expires_in_ms, SEGMENT_FIELD
                )
            if self.open is not None:
                self.open.text += fragment.text
            self._put(self.releaser.feed(fragment.text))
            if fragment.flush or fragment.mark:
                self._close()
        if fragment.mark:
            self.queue.put_nowait(MarkAt(fragment.mark))

    def on_quiet(self, quiet_ms: float) -> None:
        self._put(self.releaser.on_quiet(quiet_ms))

    def end(self) -> None:
        """The text is over: everything left, the open segment closed."""
        self._put(self.releaser.end())
        self._close()

    # -- inside ------------------------------------------------------------------------------

    def _close(self) -> None:
        """Release what is buffered; the open segment (if any) ends here."""
        self._put(self.releaser.flush())
        if self.open is not None:
            self.queue.put_nowait(SegmentDone(self.open))
            self.open = None

    def _put(self, items: list[StreamItem], segment: Segment | None = None) -> None:
        self._put_all(self._tagged(items, segment))

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

    def _replace(self, fragment: TextFragment, now: float) -> None:
        name = fragment.replace
        old = self.book.latest(name)
        new = self.book.revise(name, now, fragment.expires_in_ms)
        new.text = fragment.text
        released = self.releaser.feed(fragment.text) + self.releaser.flush()
        items = self._tagged(released, new) + [SegmentDone(new)]
        if old is not None and old.open:
            if old.state is State.SPEAKING:
                if fragment.if_started is IfStarted.DROP_NEW:
                    new.finish(Outcome.NOT_SPOKEN)
                    items = [SegmentDone(new)]
                    self.book.keep(old)
                elif fragment.if_started is IfStarted.CUT:
                    self._unqueue(old)
                    old.finish(Outcome.CUT)
                    self._stop(old, at_word=True)
            else:  # not started: none of it is ever spoken
                taken = old.state is State.TAKEN
                self._unqueue(old)
                old.finish(Outcome.REPLACED)
                if taken:
                    self._stop(old, at_word=False)
        self._insert_after(old, items)

    def _stop(self, segment: Segment, at_word: bool) -> None:
        speaker = self._speaker()
        if speaker is not None:
            speaker.stop_segment(segment, at_word)

    def _clear(self) -> None:
        """Barge-in: drop what is buffered and queued (see the module's docstring)."""
        self.releaser.clear()
        kept: list[StreamItem] = []
        for item in self._take_all():
            if isinstance(item, MarkAt):
                kept.append(MarkAt(item.name, dropped=True))
            elif isinstance(item, SegmentDone):
                _finish_cleared(item.segment)
                kept.append(item)
            elif isinstance(item, Speak) and item.segment is not None:
                item.segment.dropped_items = True
        if self.open is not None:
            _finish_cleared(self.open)
            kept.append(SegmentDone(self.open))
            self.open = None
        self._put_all(kept)
        speaker = self._speaker()
        if speaker is not None:
            speaker.interrupt()

    def _unqueue(self, segment: Segment) -> None:
        """Take `segment`'s queued utterances (and silences inside it) off the queue."""
        items = self._take_all()
        kept = [i for i in items if not (isinstance(i, Speak) and i.segment is segment)]
        if len(kept) < len(items):
            segment.dropped_items = True
        self._put_all(kept)

    def _insert_after(self, segment: Segment | None, new: list[StreamItem]) -> None:
        """Queue `new` right after `segment`'s end if that is still queued, else at the end."""
        items = self._take_all()
        at = len(items)
        for k, item in enumerate(items):
            if isinstance(item, SegmentDone) and item.segment is segment:
                at = k + 1
                break
        self._put_all(items[:at] + new + items[at:])

    def _take_all(self) -> list[StreamItem]:
        """Everything queued (only stream items are queued before the end marker)."""
        items: list[StreamItem] = []
        while True:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return items
            items.append(item)  # type: ignore[arg-type]

    def _put_all(self, items: list[StreamItem]) -> None:
        for item in items:
            self.queue.put_nowait(item)


def _finish_cleared(segment: Segment) -> None:
    """A clear: a segment speaking is cut (the speaking side stops it), one not started is
    never spoken."""
    if segment.open:
        segment.finish(Outcome.CUT if segment.state is State.SPEAKING else Outcome.NOT_SPOKEN)
