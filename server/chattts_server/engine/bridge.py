"""The hand-off between the engine thread and asyncio handlers, one `RequestHandle` per request.

The engine thread calls `emit`/`fail`; the handler awaits `next_event`. Events cross threads via
`loop.call_soon_threadsafe`. The buffer is bounded in effect: the engine reads `outstanding`
and stops generating for a request whose reader is `output_buffer_chunks` behind, so a slow
client slows only itself and never grows memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from .events import AudioChunk, EngineEvent, UtteranceDone
from .utterance import UtteranceRequest


@dataclass(frozen=True)
class _Failed:
    """The request ended with `error` (raised to the reader)."""

    error: BaseException


class RequestHandle:
    def __init__(
        self,
        request: UtteranceRequest,
        loop: asyncio.AbstractEventLoop,
        wake_engine: Callable[[], None],
    ) -> None:
        self.request = request
        self.loop = loop
        self._queue: asyncio.Queue[EngineEvent | _Failed] = asyncio.Queue()
        self._wake_engine = wake_engine
        self.produced = 0
        """Audio chunks emitted (written by the engine thread only)."""
        self.consumed = 0
        """Audio chunks taken by the reader (written by the event loop only)."""
        self.paused = False
        """The reader is `output_buffer_chunks` behind: the engine skips this request
        (`ChatTTSEngine._pause_slow_readers` sets it before each step)."""
        self.closed = False
        """The reader went away (cancel, disconnect, deadline); set on the event loop."""
        self.ended = False
        """The engine delivered the last event or an error."""

    @property
    def outstanding(self) -> int:
        return self.produced - self.consumed

    # -- engine thread ---------------------------------------------------------------------

    def emit(self, event: EngineEvent) -> None:
        if isinstance(event, AudioChunk):
            self.produced += 1
        elif isinstance(event, UtteranceDone):
            self.ended = True
        self.loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def fail(self, error: BaseException) -> None:
        self.ended = True
        self.loop.call_soon_threadsafe(self._queue.put_nowait, _Failed(error))

    # -- event loop ------------------------------------------------------------------------

    async def next_event(self) -> EngineEvent:
        item = await self._queue.get()
        if isinstance(item, _Failed):
            raise item.error
        if isinstance(item, AudioChunk):
            self.consumed += 1
            if self.paused:
                self._wake_engine()
        return item
