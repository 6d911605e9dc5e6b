"""One resumable StreamingSynthesize stream over as many calls as its connection needs.

`AsyncTTSClient.open_stream` asks for a resumable stream (`SynthesisConfig.resumable`). When its
call fails the way a dropped connection fails (UNAVAILABLE, UNKNOWN, INTERNAL) after the server
sent the stream's id and token, this opens a new call whose first message is a `ResumeStream`
with the samples the listener has and the events received since them, sends every text message
again (each carries its `seq`, and the server applies each once), and goes on reading: the
caller sees one `ResumedEvent` and then the rest of the stream, nothing lost or repeated. It
tries until the server's resume window (`chattts-resume-window-s`) has passed.

Where the stream cannot be resumed, because its server is gone (the resume is answered
NOT_FOUND: killed and restarted, or a proxy sent it to another replica; OUT_OF_RANGE) or its
window passed, it goes on as a new stream with the same config, from the first word of the
caller's text that the listener has not wholly heard (chattts_client/continuation.py): the
caller sees a `ResumedEvent` with `new_stream` True, and events whose offsets go on from those
received. Any other refusal (PERMISSION_DENIED) ends the iteration with the original failure,
as does a lost SSML stream (its document cannot be cut at a word).

While its text goes on, the call also carries a `ReadReceipt` per audio chunk read
(`SynthesisConfig.read_receipts`), so the server finds a caller that stopped reading.

`cancel()` sends `CancelStream`, so the server frees the stream's slot at once instead of
keeping it for a resume: on the call while its requests are open, else (after `end_input`) on a
call of its own that resumes the stream only to end it. The client's `close()` waits for that
(CANCEL_GRACE_S at most, then cancels outright).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

import grpc

from chattts_client.calls import SynthesisStats
from chattts_client.continuation import IDENTITY, Heard, continuation_plan
from chattts_client.messages import Event, ResumedEvent, StreamItem, event_from_pb, text_input
from chattts_proto.chattts.v1 import tts_pb2

Request = tts_pb2.StreamingSynthesizeRequest
StartCall = Callable[[AsyncIterator[Request], str, bool], Any]
"""Starts a StreamingSynthesize call on these requests: to resume the stream of the id given
(not ""), with the id in the `chattts-stream-id` header, which a proxy's stickiness routes on
(deploy/haproxy); with wait_for_ready when the last flag (a call after a failure) is set."""

DROPPED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
"""The statuses a cut connection ends a call with."""
GONE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE)
"""A resume's answers when the server holds the stream no more (or not the audio asked for):
it goes on as a new stream."""
PROXIED_REFUSAL = (grpc.StatusCode.CANCELLED,)
"""How a resume refused through a proxy may end: HAProxy resets a call whose requests are open
(the text goes on) when the server ends it, and grpc reports CANCELLED in place of the
server's NOT_FOUND."""
CANCEL_GRACE_S = 30.0
DEFAULT_WINDOW_S = 20.0
"""How long a new stream is tried for when the server did not say its resume window."""
_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)


class ResumingEventStream(AsyncIterator[Event]):
    """The events of one resumable stream, with `stats`, `call` and `cancel()` as
    `AsyncEventStream` has."""

    def __init__(
        self,
        start_call: StartCall,
        config: tts_pb2.SynthesisConfig,
        items: AsyncIterable[StreamItem],
        stats: SynthesisStats,
        on_cancel: Callable[[asyncio.Future[None]], object] = lambda _: None,
    ) -> None:
        self._start_call = start_call
        self._on_cancel = on_cancel
        self.stats = stats
        self._items: list[StreamItem] = []
        """The caller's items, as it sent them."""
        self._sent: list[Request] = []
        """The requests of the stream now carrying them, from its first text on."""
        self._heard = Heard()
        self._timeline = IDENTITY
        """The events of the stream now carrying the caller's on the caller's timeline."""
        self._input_done = False
        self._cancelling = False
        self._changed = asyncio.Event()
        self._headers: dict[str, str] = {}
        self._headers_noted = False
        self._requests_open = False
        self._ending: asyncio.Future[None] | None = None
        """The first call's headers were read: `_headers` then says whether it is resumable."""
        self._offset = 0
        self._events_since_audio = 0
        self._pump = asyncio.ensure_future(self._take(items))
        self._config = tts_pb2.SynthesisConfig()
        self._config.CopyFrom(config)
        self._config.resumable = True
        self._config.read_receipts = True
        self._call = start_call(self._requests(Request(config=self._config)), "", False)
        self._responses: AsyncIterator[Any] = self._call.__aiter__()

    @property
    def call(self) -> Any:
        """The grpc.aio call now carrying the stream."""
        return self._call

    def __aiter__(self) -> ResumingEventStream:
        return self

    async def __anext__(self) -> Event:
        try:
            response = await self._read()
        except grpc.aio.AioRpcError as exc:
            await self._note_headers()
            if self._cancelling or exc.code() not in DROPPED or not self._headers:
                self.stats.finish()
                raise
            return await self._go_on(exc)
        except BaseException:
            self.stats.finish()
            raise
        await self._note_headers()
        event = self._timeline.event(event_from_pb(response))
        self._observe(response)
        self._heard.observe(event)
        self.stats.observe(event)
        return event

    async def _read(self) -> Any:
        """The next response. A read that grpc.aio sees cancelled cancels its call, which
        would leave the server holding the stream for a resume: the read is shielded, and this
        task being cancelled cancels the stream (`cancel`) instead."""
        read = asyncio.ensure_future(self._responses.__anext__())
        try:
            return await asyncio.shield(read)
        except asyncio.CancelledError:
            if not read.done():
                read.add_done_callback(_drop_result)
                self.cancel()
            raise

    def cancel(self) -> None:
        """End the stream: `CancelStream` to the server (on the call while its requests are
        open, else on a call of its own that resumes the stream to end it)."""
        if self._cancelling:
            return
        self._cancelling = True
        self._pump.cancel()
        if self._headers_noted and not self._headers:  # a plain stream: a plain cancel
            self._call.cancel()
            return
        if self._requests_open:
            self._notify()  # CancelStream, also before the headers come (they may be coming)
        else:
            self._call.cancel()  # half-closed: the server holds the stream for a resume...
        self._ending = asyncio.ensure_future(self._end_on_server(not self._requests_open))
        self._on_cancel(self._ending)  # the client's close() waits for it

    async def _end_on_server(self, by_resuming: bool) -> None:
        """...which the resume of a call of its own ends, where the requests were closed."""
        call = self._call
        try:
            if by_resuming:
                metadata = await _within(call.initial_metadata(), CANCEL_GRACE_S)
                headers = _headers_of(metadata)
                if "chattts-stream-id" not in headers:
                    return  # none was sent: the server did not keep the stream
                self._headers = headers
                requests = _two(Request(resume=self._resume_message()), _CANCEL)
                call = self._start_call(requests, headers["chattts-stream-id"], True)
            await _within(call.code(), CANCEL_GRACE_S)
        except (TimeoutError, grpc.aio.AioRpcError):
            call.cancel()

    # -- the requests --------------------------------------------------------------------------

    async def _take(self, items: AsyncIterable[StreamItem]) -> None:
        async for item in items:
            self._items.append(item)
            self._send(text_input(item))
        self._input_done = True
        self._send(Request(text=tts_pb2.TextInput(last=True)))

    def _send(self, request: Request) -> None:
        """A text message for the stream now carrying the caller's: numbered on it."""
        request.text.seq = len(self._sent) + 1
        self._sent.append(request)
        self._notify()

    def _requests(self, first: Request) -> AsyncIterator[Request]:
        """One call's requests: `first`, every text message sent so far (the server drops those
        it has applied), then each new one, and a `ReadReceipt` after each audio chunk read
        while the text goes on (SynthesisConfig.read_receipts); half-closed after the text's
        `last`, since a proxy
        cuts a call whose requests are still open when the server ends it (HAProxy 2.6 resets
        it, CANCEL). From then on the channel's HTTP/2 window (64 KiB: the client turns off
        grpc's bandwidth probing) is what bounds the audio in flight. The messages are those of
        the stream now carrying the caller's, not of one that takes over later."""
        return self._requests_of(first, self._sent)

    async def _requests_of(self, first: Request, sent: list[Request]) -> AsyncIterator[Request]:
        self._requests_open = True
        try:
            yield first
            index = 0
            receipted = self._offset if first.HasField("resume") else 0  # a resume says it
            while True:
                if self._cancelling:
                    yield _CANCEL
                    return
                if index < len(sent):
                    index += 1
                    yield sent[index - 1]
                    continue
                if self._input_done:
                    return  # half-closed after `last` (see above)
                if self._sent is sent and self._offset > receipted:  # on this stream's samples
                    receipted = self._offset
                    yield Request(receipt=tts_pb2.ReadReceipt(sample_offset=receipted))
                    continue
                changed = self._changed
                await changed.wait()
        finally:
            self._requests_open = False

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- resuming ------------------------------------------------------------------------------

    async def _note_headers(self) -> None:
        if not self._headers_noted:
            metadata = await self._call.initial_metadata()
            self._headers = _headers_of(metadata)
            self._headers_noted = True
            self._notify()

    def _observe(self, response: tts_pb2.StreamingSynthesizeResponse) -> None:
        """What a resume asks for: the samples received, the events since them."""
        if response.WhichOneof("response") == "audio" and response.audio.num_samples:
            self._offset = response.audio.sample_offset + response.audio.num_samples
            self._notify()  # its receipt
            self._events_since_audio = 0
        else:
            self._events_since_audio += 1

    def _resume_message(self) -> tts_pb2.ResumeStream:
        return tts_pb2.ResumeStream(
            stream_id=self._headers["chattts-stream-id"],
            resume_token=self._headers["chattts-resume-token"],
            sample_offset=self._offset,
            events_received=self._events_since_audio,
        )

    async def _go_on(self, failure: grpc.aio.AioRpcError) -> ResumedEvent:
        """The stream resumed on its server, else continued as a new stream; `failure` where
        neither can be (a refusal, or no server answers within the window)."""
        began = time.perf_counter()
        window_s = float(self._headers.get("chattts-resume-window-s", DEFAULT_WINDOW_S))
        resume = self._resume_message()
        answered = await self._answered(
            lambda: self._start_call(
                self._requests(Request(resume=resume)), resume.stream_id, True
            ),
            began + window_s,
        )
        if isinstance(answered, tuple):
            self._adopt(answered[0])
            return ResumedEvent(time.perf_counter() - began, self._offset, answered[1])
        if self._cancelling or (answered not in GONE + PROXIED_REFUSAL and answered is not None):
            raise failure
        if self._config.text_format == tts_pb2.SSML:
            raise failure  # an SSML document cut at a word is no document
        return await self._continue(failure, began, window_s)

    async def _continue(
        self, failure: grpc.aio.AioRpcError, began: float, window_s: float
    ) -> ResumedEvent:
        """A new stream with the same config, from the first word not wholly heard."""
        self._call.cancel()
        plan = continuation_plan(self._items, self._heard)
        self._sent = []
        for item in plan.items:
            self._send(text_input(item))
        if self._input_done:
            self._send(Request(text=tts_pb2.TextInput(last=True)))
        self._timeline = plan.timeline
        self._offset, self._events_since_audio = 0, 0
        deadline = time.perf_counter() + window_s
        answered = await self._answered(
            lambda: self._start_call(self._requests(Request(config=self._config)), "", True),
            deadline,
        )
        if not isinstance(answered, tuple):
            raise failure
        self._adopt(answered[0])
        self._headers, self._headers_noted = {}, False
        return ResumedEvent(
            time.perf_counter() - began,
            self._heard.samples,
            answered[1],
            new_stream=True,
            from_source=plan.from_source,
            from_word=plan.from_word,
        )

    async def _answered(
        self, start: Callable[[], Any], deadline: float
    ) -> tuple[Any, int] | grpc.StatusCode | None:
        """Calls made by `start` until one is answered (its headers come, naming a stream):
        (the call, the calls it took); else the status that refused the last one, or None
        when `deadline` (time.perf_counter()) passed with every call dropped."""
        for attempt in range(1, 1000):
            call = start()
            left_s = deadline - time.perf_counter()
            try:
                metadata = await _within(call.initial_metadata(), max(left_s, 0.01))
            except TimeoutError:
                metadata = None
            if metadata and any(k == "chattts-stream-id" for k, _ in metadata):
                return call, attempt
            code = await call.code() if call.done() else None
            call.cancel()
            if code is not None and code not in DROPPED:
                return code
            if left_s <= 0:
                return None
            await asyncio.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S)) - 1])
        return None

    def _adopt(self, call: Any) -> None:
        self._call, self._responses = call, call.__aiter__()


async def _within(awaitable: Any, timeout_s: float) -> Any:
    """`awaitable`'s result; TimeoutError once `timeout_s` passes. Under asyncio.timeout where
    there is one (3.11+): wait_for before 3.12 swallows a cancel that lands as the awaited thing
    completes, and a stream its caller cancelled would go on."""
    if sys.version_info < (3, 11):
        return await asyncio.wait_for(awaitable, timeout_s)
    async with asyncio.timeout(timeout_s):
        return await awaitable


def _drop_result(read: asyncio.Future[Any]) -> None:
    """A read nobody waits for any longer: its outcome is taken so that none is reported."""
    if not read.cancelled():
        read.exception()


_CANCEL = Request(cancel=tts_pb2.CancelStream())


def _headers_of(metadata: Any) -> dict[str, str]:
    """A call's initial metadata as a dict of its text values."""
    return {k: v for k, v in (metadata or ()) if isinstance(v, str)}


async def _two(first: Request, second: Request) -> AsyncIterator[Request]:
    yield first
    yield second
