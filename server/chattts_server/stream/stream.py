"""One stream's state and its one task: the text it was sent, in, its events, out.

`Stream.events` plays the stream's items (stream/items.py) on one timeline of samples
(stream/output.py): an utterance becomes an engine request and its engine events become
`AudioOut`, then `WordTimingsOut` when asked for, then `UtteranceEnded`; a mark a `MarkReached`
at the samples sent so far; a segment's end a `SegmentEnded`; a silence `AudioOut` of zeros.

Only this task changes the stream's state. The reader task posts what it read on the inbox
(stream/reader.py); this task applies each message (`TextQueue.apply`) whenever it waits:
between items, while the engine works on an utterance, while pacing. What a message asks of the
utterance being spoken (a clear, a replace) comes back as a `Stop`, carried out by `stop`:
at once, or at the next word boundary for a CUT. Text left buffered with no message for a
while is released by the same waits (`TextFrontEnd.quiet_deadline_ms`).

Named segments (stream/segments.py): an utterance of a segment moves it to TAKEN, its first
chunk to SPEAKING (or, past its `expires_in_ms`, ends it EXPIRED with no audio: checked when it
is taken, by the engine before its prefill, and before its first chunk is sent). A stream with
`max_lag_s` (stream/catch_up.py) skips its oldest utterances and speeds up the rest when its
text waits too long; every utterance reports its lag.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar

from ..engine.events import AudioChunk, EngineEvent, Spoken, UtteranceDone
from ..engine.protocol import Engine
from ..engine.utterance import UtteranceRequest
from ..errors import ExpiredError
from ..text.duration import estimate_duration_s
from .events import SessionEvent, UtteranceEnded
from .items import MarkAt, SegmentDone, Silence, Speak, StreamItem
from .output import StreamOutput
from .reader import EndOfText, Inbox, Received
from .segments import State
from .settings import StreamSettings
from .text_queue import Stop, TextQueue, front_end
from .utterance import Utterance, ended

_T = TypeVar("_T")


class Stream:
    def __init__(
        self,
        engine: Engine,
        settings: StreamSettings,
        deadline: float | None,
        inbox: Inbox | None = None,
        items: Iterable[StreamItem] = (),
    ) -> None:
        """Streamed text from `inbox`, or a whole text's `items` (no inbox)."""
        self.engine = engine
        self.settings = settings
        self.deadline = deadline
        self.stream_id = uuid.uuid4().hex[:12]
        """Names the stream's engine requests and its log lines."""
        self.num_utterances = 0
        """Utterances begun; the next one gets this index."""
        self.out = StreamOutput(settings, engine.model_info.sample_rate)
        self.text = TextQueue(front_end(settings))
        self.text.pending.extend(items)
        self._inbox = inbox
        self._text_over = inbox is None
        self._failure: BaseException | None = None
        """What the text ended with, raised once what came before it is spoken."""
        self._last_message_at = time.monotonic()
        self._current: Utterance | None = None

    async def events(self) -> AsyncGenerator[SessionEvent, None]:
        """Every event of the stream, in order."""
        while (item := await self._next_item()) is not None:
            if isinstance(item, Speak):
                async for event in self._speak_item(item):
                    yield event
            elif isinstance(item, MarkAt):
                yield self.out.mark(item)
            elif isinstance(item, SegmentDone):
                yield self.out.segment_end(item.segment)
            elif isinstance(item, Silence):
                async for audio in self.out.silence(item, self._last_index()):
                    yield audio
        for event in self.out.finish(self._last_index()):
            yield event

    def stop(self, stop: Stop) -> None:
        """Carry out what a message asks of the utterance being spoken (if it concerns it)."""
        u = self._current
        if u is None or (stop.segment is not None and u.item.segment is not stop.segment):
            return
        if stop.at_word and u.sent:
            u.cut_at_word = True
        else:
            u.halt(stop.reason)

    # -- the text side -----------------------------------------------------------------------

    async def _next_item(self) -> StreamItem | None:
        """The next item to play, once there is one; None when the text is over and all
        played; the text's failure once what came before it is played."""
        while not self.text.pending:
            if self._text_over:
                if self._failure is not None:
                    raise self._failure
                return None
            await self._listening(None)
        return self.text.pending.popleft()

    async def _listening(self, work: Awaitable[_T] | None, u: Utterance | None = None) -> _T | None:
        """Wait for `work`, applying messages and quiet-time releases meanwhile; None when `u`
        is stopped first (`work` is then cancelled). With no work: one message or release."""
        task = asyncio.ensure_future(work) if work is not None else None
        get: asyncio.Future[Received | EndOfText | BaseException] | None = None
        try:
            while u is None or not u.stopped:
                waits: set[asyncio.Future[Any]] = {task} if task is not None else set()
                if self._inbox is not None and not self._text_over:
                    get = asyncio.ensure_future(self._inbox.get())
                    waits.add(get)
                done, _ = await asyncio.wait(
                    waits, timeout=self._quiet_s(), return_when=asyncio.FIRST_COMPLETED
                )
                if get is not None:
                    if get in done:
                        self._apply(get.result())
                    else:
                        get.cancel()  # an item it was woken for stays queued
                    get = None
                if not done:
                    self._on_quiet()
                if task is None:
                    return None
                if task in done:
                    return task.result()
            return None
        finally:
            for pending in (get, task):
                if pending is not None and not pending.done():
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)

    def _apply(self, message: Received | EndOfText | BaseException) -> None:
        try:
            if isinstance(message, Received):
                self._last_message_at = message.at
                for stop in self.text.apply(message.fragment, message.at):
                    self.stop(stop)
            elif isinstance(message, EndOfText):
                self._text_over = True
                self.text.end()
            else:
                raise message
        except Exception as exc:  # a bad message, or the request stream failed
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._text_over, self._failure = True, exc

    def _quiet_s(self) -> float | None:
        """Seconds until buffered text is released for quiet; None: nothing waits for it."""
        if self._text_over:
            return None
        quiet_ms = self.text.releaser.quiet_deadline_ms()
        if quiet_ms is None:
            return None
        return max(0.0, self._last_message_at + quiet_ms / 1000 - time.monotonic())

    def _on_quiet(self) -> None:
        self.text.on_quiet((time.monotonic() - self._last_message_at) * 1000)

    # -- the speaking side -------------------------------------------------------------------

    async def _speak_item(self, item: Speak) -> AsyncGenerator[SessionEvent, None]:
        """An utterance as its segment and the stream's lag limits decide: skipped (its segment
        is done or expired; the oldest of a backlog), sped up, or spoken."""
        segment = item.segment
        now = time.monotonic()
        if segment is not None:
            if not segment.open:
                return  # replaced, cut or expired: nothing more of it is said
            if segment.state is State.QUEUED:
                if segment.expired(now):
                    segment.end(State.EXPIRED)
                    return
                segment.move(State.TAKEN)
        elif (limits := self.settings.lag_limits) is not None:
            lag_s = self._lag_s(item, now)
            if self._backlog_skips(item, now):
                yield self._skipped(item, lag_s)
                return
            speed = limits.speed_for(lag_s, self._speed(item))
            item = dataclasses.replace(item, speed=speed)
        async for event in self._speak(item):
            yield event

    async def _speak(self, item: Speak) -> AsyncGenerator[SessionEvent, None]:
        """Synthesize one utterance: audio as it comes, then its closing events."""
        u = self._current = Utterance(self.num_utterances, item, self._request(item), self.out)
        self.num_utterances += 1
        engine_events = aiter(self.engine.synthesize(u.request))
        done: UtteranceDone | None = None
        try:
            while (
                done is None and (event := await self._engine_event(engine_events, u)) is not None
            ):
                if isinstance(event, Spoken):
                    u.spoken = event.text
                elif isinstance(event, AudioChunk):
                    for audio in await self._send(u, event):
                        yield audio
                elif isinstance(event, UtteranceDone):
                    done = event
        finally:
            self._current = None
            await engine_events.aclose()  # type: ignore[attr-defined]
        model = self.engine.model_info
        span = item.text.span()
        for closing in u.closing(
            self.out, done, self.settings.word_timing, model.samples_per_token
        ):
            if span is not None and isinstance(closing, UtteranceEnded):
                self.out.heard(span[1])  # all of it is heard (or was cut) by its end
            yield closing

    async def _engine_event(
        self, events: AsyncIterator[EngineEvent], u: Utterance
    ) -> EngineEvent | None:
        """The utterance's next engine event; None once it is stopped (or it expired)."""
        if u.stopped:
            return None
        try:
            return await self._listening(anext(events), u)
        except ExpiredError:
            u.expire()
        except StopAsyncIteration:
            u.halt("cleared")
        return None

    async def _send(self, u: Utterance, chunk: AudioChunk) -> list[SessionEvent]:
        """A chunk of the utterance goes out, after pacing; nothing if it was stopped first."""
        await self._paced(u)
        if u.stopped:
            return []
        if u.lag_s is None and not u.first_chunk(self.out.playout.heard_at(time.monotonic())):
            return []
        pcm = u.take(chunk.pcm, self.out.native_rate)
        placed = await self.out.audio(pcm, u.index)
        self.out.heard(u.heard_source_end(self.out))
        return [dataclasses.replace(a, heard_source_end=self.out.heard_source_end) for a in placed]

    async def _paced(self, u: Utterance) -> None:
        """Wait until the audio sent so far runs at most `pace_lead_s` ahead of a real-time
        listener (no wait without it). The engine pauses the request once its output buffer is
        full, as for a slow reader."""
        lead_s = self.settings.pace_lead_s
        if lead_s is None:
            return
        while not u.stopped and (wait_s := self.out.playout.ahead_s(time.monotonic()) - lead_s) > 0:
            await self._listening(asyncio.sleep(wait_s), u)

    # -- catching up -------------------------------------------------------------------------

    def _lag_s(self, item: Speak, now: float) -> float:
        """`item`'s lag if it started now."""
        return self.out.playout.heard_at(now) - (item.received_at or now)

    def _backlog_skips(self, item: Speak, now: float) -> bool:
        """Skip `item`, the oldest of the queued utterances, to bring the lag back under the
        hard limit (stream/catch_up.py `oldest_to_skip`)."""
        limits = self.settings.lag_limits
        assert limits is not None
        queued = [item] + [
            i for i in self.text.pending if isinstance(i, Speak) and i.segment is None
        ]
        lags_s = [self._lag_s(i, now) for i in queued]
        durations_s = [estimate_duration_s(i.text.text, self._speed(i)) for i in queued]
        return limits.oldest_to_skip(lags_s, durations_s) > 0

    def _skipped(self, item: Speak, lag_s: float) -> SessionEvent:
        """An utterance skipped for lag: it ends at once, its text kept, no audio."""
        index = self.num_utterances
        self.num_utterances += 1
        done = UtteranceDone(item.text.text, 0, 0, 0.0, 0.0, "skipped")
        return ended(index, item, self._speed(item), self.out, done, self.out.sample_offset, lag_s)

    # -- helpers -----------------------------------------------------------------------------

    def _speed(self, item: Speak) -> int:
        return self.settings.speed if item.speed is None else item.speed

    def _last_index(self) -> int:
        """The utterance a silence or the stream's last bytes belong to (0 before any)."""
        return max(0, self.num_utterances - 1)

    def _request(self, item: Speak) -> UtteranceRequest:
        s = self.settings
        segment = item.segment
        waiting = segment is not None and segment.state is State.TAKEN
        return UtteranceRequest(
            request_id=f"{self.stream_id}-{self.num_utterances}",
            text=item.text.text,
            voice=s.voice,
            speed=self._speed(item),
            refine=s.refine,
            sampling=s.sampling,
            chunking=s.chunking,
            deadline=self.deadline,
            source=item.text,
            priority=s.priority,
            expires_at=segment.expires_at if waiting and segment is not None else None,
            word_timing=s.word_timing,
        )
