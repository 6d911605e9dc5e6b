"""One call's events, as the clients return them: `EventStream` (sync), `AsyncEventStream`,
each with the call's `SynthesisStats` and `cancel()`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from chattts_client.messages import AudioChunkEvent, Event, UtteranceEndEvent, event_from_pb


@dataclass
class SynthesisStats:
    """Client-side figures of one call, updated as its events are iterated."""

    started_at: float  # time.perf_counter() when the call was started
    first_audio_at: float | None = None  # perf_counter() at the first audio chunk
    finished_at: float | None = None  # perf_counter() when the response stream ended or failed
    num_chunks: int = 0
    num_utterances: int = 0
    num_audio_bytes: int = 0
    audio_s: float = 0.0  # seconds of audio received

    def observe(self, event: Event, now: float | None = None) -> None:
        if isinstance(event, AudioChunkEvent):
            if self.first_audio_at is None:
                self.first_audio_at = time.perf_counter() if now is None else now
            self.num_chunks += 1
            self.num_audio_bytes += len(event.audio)
            self.audio_s += event.duration_s
        elif isinstance(event, UtteranceEndEvent):
            self.num_utterances += 1

    def finish(self, now: float | None = None) -> None:
        if self.finished_at is None:
            self.finished_at = time.perf_counter() if now is None else now

    @property
    def ttfa_ms(self) -> float | None:
        """Milliseconds from call start to the first audio chunk; None before it."""
        if self.first_audio_at is None:
            return None
        return (self.first_audio_at - self.started_at) * 1000.0

    @property
    def total_s(self) -> float:
        """Seconds from call start to the end of the stream (or to now, while it runs)."""
        end = time.perf_counter() if self.finished_at is None else self.finished_at
        return end - self.started_at

    @property
    def rtf(self) -> float | None:
        """Real-time factor: wall time / audio seconds (below 1 is faster than real time)."""
        return self.total_s / self.audio_s if self.audio_s > 0 else None


class EventStream(Iterator[Event]):
    """The events of one sync call, with `stats` and `cancel()`.

    Leaving a `with` block (or calling `cancel`) before the end cancels the call.
    """

    def __init__(self, call: Any, stats: SynthesisStats) -> None:
        self._call = call
        self.stats = stats

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        try:
            response = next(self._call)
        except BaseException:  # StopIteration at the end, grpc.RpcError on failure
            self.stats.finish()
            raise
        event = event_from_pb(response)
        self.stats.observe(event)
        return event

    def cancel(self) -> None:
        self._call.cancel()

    @property
    def call(self) -> Any:
        """The underlying grpc call (for metadata, code, details)."""
        return self._call

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._call.cancel()  # no-op once the call has finished


class AsyncEventStream(AsyncIterator[Event]):
    """The events of one asyncio call, with `stats` and `cancel()`."""

    def __init__(self, call: Any, stats: SynthesisStats) -> None:
        self._call = call
        self._responses: AsyncIterator[Any] | None = None
        self.stats = stats

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        if self._responses is None:
            self._responses = self._call.__aiter__()
        try:
            response = await self._responses.__anext__()
        except BaseException:  # StopAsyncIteration, grpc.aio.AioRpcError, CancelledError
            self.stats.finish()
            raise
        event = event_from_pb(response)
        self.stats.observe(event)
        return event

    def cancel(self) -> None:
        self._call.cancel()

    @property
    def call(self) -> Any:
        return self._call

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._call.cancel()
