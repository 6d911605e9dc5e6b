"""A StreamingSynthesize call driven by method calls: `push` text as it comes, `flush`, `mark`,
`clear`, `end_input`, and iterate the events meanwhile.

`AsyncTTSClient.stream` takes an iterable of texts, which suits a source that is itself an
iterator (stdin, a file). A voice agent instead gets text from callbacks (an LLM token, an end
of turn, a barge-in) while another task reads audio: this object is that shape, and what the
LiveKit and Pipecat adapters are built on. It keeps the stream's `Timeline` (what was sent,
every event received), so the caller's own text of a word timing, or what a listener heard at a
playback position, is one call away.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable

from chattts_client.calls import AsyncEventStream, SynthesisStats
from chattts_client.messages import Clear, Event, Flush, Mark, Replace, Segment, StreamItem
from chattts_client.resuming import ResumingEventStream
from chattts_client.timeline import Timeline

OpenCall = Callable[[AsyncIterable[StreamItem]], AsyncEventStream | ResumingEventStream]


class PushStream(AsyncIterator[Event]):
    """One StreamingSynthesize call; made by `AsyncTTSClient.open_stream`.

    Sending never blocks: items wait in an unbounded queue until grpc writes them (text is
    small next to the audio it makes). Iterating gives the call's events, as
    `AsyncEventStream` does; leaving an `async with` block cancels the call.
    """

    def __init__(self, open_call: OpenCall) -> None:
        self._items: asyncio.Queue[StreamItem | None] = asyncio.Queue()
        self._ended = False
        self._cancelled = False
        self.timeline = Timeline()
        self._events = open_call(self._requests())

    async def _requests(self) -> AsyncIterator[StreamItem]:
        while (item := await self._items.get()) is not None:
            yield item

    # -- sending -------------------------------------------------------------------------------

    def push(self, text: str) -> None:
        """Send a fragment of text; the server's release policy decides when it is spoken."""
        self._send(text)

    def flush(self, text: str = "") -> None:
        """Send `text`, then synthesize everything buffered now (an end of turn)."""
        self._send(Flush(text))

    def mark(self, name: str, text: str = "") -> None:
        """Send `text`, then a mark: the server answers with a `MarkEvent` named `name` right
        after the audio of everything sent before it (at once if that made no sound; with
        `dropped` set if a clear cut that text short). A mark ends the text before it, as a
        flush does."""
        self._send(Mark(name, text))

    def segment(self, name: str, text: str, expires_in_ms: int = 0) -> None:
        """Send `text` as the segment `name` (a prompt that may be replaced, or expire: it
        waits at most `expires_in_ms` for its first audio). Its `SegmentEndEvent` says how it
        ended."""
        self._send(Segment(name, text, expires_in_ms))

    def replace(
        self, name: str, text: str, if_started: str = "finish", expires_in_ms: int = 0
    ) -> None:
        """The segment `name` now says `text` (see `Replace`: `if_started` is "finish",
        "cut" or "drop_new" for a segment already speaking)."""
        self._send(Replace(name, text, if_started, expires_in_ms))

    def clear(self, text: str = "", mark: str = "") -> None:
        """Barge-in: drop what is buffered and stop the utterance being spoken (it ends with
        finish_reason "cleared"), then speak `text`. `mark` names a mark placed right at the
        cut (before `text`): its `MarkEvent` follows every event of the text that was cleared,
        which tells when the cleared turn's last event has come."""
        if not mark:
            self._send(Clear(text))
            return
        self._send(Clear())
        self._send(Mark(mark))
        if text:
            self._send(text)

    def end_input(self) -> None:
        """Half-close: the server speaks what is left and ends the call. Idempotent."""
        if not self._ended:
            self._ended = True
            self._items.put_nowait(None)

    def _send(self, item: StreamItem) -> None:
        if self._ended:
            raise RuntimeError("the stream's input has ended")
        self.timeline.sent(item)
        self._items.put_nowait(item)

    @property
    def input_ended(self) -> bool:
        return self._ended

    @property
    def sent_text(self) -> str:
        """Everything sent so far, in order: what the server's source spans index into."""
        return self.timeline.text

    # -- receiving -----------------------------------------------------------------------------

    def __aiter__(self) -> PushStream:
        return self

    async def __anext__(self) -> Event:
        """The next event; the end of the iteration once `cancel()` was called (grpc.aio would
        raise CancelledError there, which reads as this task being cancelled)."""
        if self._cancelled:
            raise StopAsyncIteration
        try:
            event = await self._events.__anext__()
        except asyncio.CancelledError:
            if self._cancelled and not _task_cancelling():
                raise StopAsyncIteration from None
            raise
        self.timeline.observe(event)
        return event

    @property
    def stats(self) -> SynthesisStats:
        return self._events.stats

    @property
    def call(self) -> object:
        """The underlying grpc.aio call (for metadata, code, details)."""
        return self._events.call

    def cancel(self) -> None:
        """End the call now (CANCELLED on the server: its slot is freed within one step; a
        resumable stream is told so with `CancelStream`); the iteration then ends."""
        self._ended = self._cancelled = True
        self._events.cancel()

    async def __aenter__(self) -> PushStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


def _task_cancelling() -> bool:
    """Whether the running task itself is being cancelled (Python 3.11+ can tell)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False
