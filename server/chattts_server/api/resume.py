"""Resumable streams (`SynthesisConfig.resumable`): a StreamingSynthesize stream that outlives
its connection.

A resumable stream runs in a task of its own, not in its call's handler. Its events go into a
`ReplayLog`, and the call attached to it writes them out (`ResumableStream.attach`). While a
call is attached, `send` waits until the call has written the event, as a door's own write
does, so a client that stops reading is found by the stall timeout as before. When the
connection drops, grpc cancels the handler and the stream is parked: it goes on generating into
the log until BUFFER_S of unsent audio wait there (then `send` waits, and the engine pauses the
request as it does for any slow reader), for `--resume-window-s`. A call whose first message is
a `ResumeStream` attaches to it again: the log is replayed from the listener's offset, and the
text messages it sends go on into the same stream, each `seq` applied once. A stream whose
window passes is cancelled and its slot freed. A stream that has ended is held for the window
too: a cut takes what was in flight (and the status) with it. A new call for a stream that is attached takes
it over (the old connection is dead but not yet known to be).

Tokens are HMAC-SHA256 of the stream id and the caller's `authorization` under a key made at
start-up: checked before the id is looked up, so a wrong token says nothing of whether the id
exists, and another caller's token, or one from before a restart, does not verify. An id starts
with this process's tag, so a resume the proxy lands on another replica is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from ..metrics import Metrics
from ..stream.events import SessionEvent
from ..stream.text_queue import TextFragment
from .errors import ClientStalledError, ResumeError
from .replay_log import ReplayLog, heard_cut

BUFFER_S = 30.0
"""Audio a parked stream may make ahead of what was written before its `send` waits."""
STREAM_ID_HEADER = "chattts-stream-id"
TOKEN_HEADER = "chattts-resume-token"
WINDOW_HEADER = "chattts-resume-window-s"
TEXT_SEQ_HEADER = "chattts-text-seq"

Write = Callable[[SessionEvent], Awaitable[None]]
_END = object()


class ResumableStream:
    """One resumable stream: its task, its log, its text, the call attached to it."""

    def __init__(self, resumer: Resumer, stream_id: str, token: str) -> None:
        self.resumer = resumer
        self.stream_id = stream_id
        self.token = token
        self.log = ReplayLog()
        self.task: asyncio.Task[Any] | None = None
        self.last_seq = 0
        """The highest TextInput.seq applied."""
        self.read_receipts = False
        """Its client sends ReadReceipts (its first call's config): each call's writes wait
        for them (api/receipts.py)."""
        self.known_to_client = False
        """Its id and token were sent: until then a dropped connection ends it (none could
        resume it)."""
        self.cancelled = False
        """CancelStream came: it is not held for a resume."""
        self._text: asyncio.Queue[TextFragment | BaseException | object] = asyncio.Queue()
        self._input_ended = False
        self._attached: asyncio.Task[Any] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()

    def start(self, run: Coroutine[Any, Any, Any]) -> None:
        self.task = asyncio.create_task(run)
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            task.exception()  # taken here: a stream whose window passes has no call to take it
        self._notify()

    # -- the stream's side --------------------------------------------------------------------

    async def fragments(self) -> AsyncIterator[TextFragment]:
        """The text of every call attached, in order, until one half-closes."""
        while (item := await self._text.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, TextFragment)
            yield item

    async def send(self, event: SessionEvent) -> None:
        """Log the event; wait until the attached call has written it (ClientStalledError after
        the stall timeout), or, parked, while BUFFER_S of audio wait unsent."""
        number = self.log.append(event)
        self._notify()
        stall_s = self.resumer.stall_timeout_s or None
        while True:
            if self._attached is None:
                if self.log.unsent_s() <= BUFFER_S:
                    return
                await self._wait(None)
                continue
            if self.log.next_write > number:
                return
            if not await self._wait(stall_s) and self._attached is not None:
                raise ClientStalledError(
                    f"stalled: the client took no audio for {stall_s:g} s "
                    "(--stall-timeout-s); the stream was cancelled"
                )

    # -- the calls' side ----------------------------------------------------------------------

    def post(self, seq: int, fragment: TextFragment, last: bool = False) -> None:
        """A text message of the attached call: applied unless its `seq` was applied before;
        `last` ends the stream's input after it."""
        if self._input_ended or (seq and seq <= self.last_seq):
            return
        self.last_seq = max(self.last_seq, seq)
        self._text.put_nowait(fragment)
        if last:
            self.end_input()

    @property
    def text_ended(self) -> bool:
        """Its client sent TextInput.last (or what could not be read)."""
        return self._input_ended

    def end_input(self, failure: BaseException | None = None) -> None:
        """The text has ended (TextInput.last), or a call sent what cannot be read (`failure`)."""
        if not self._input_ended:
            self._input_ended = True
            self._text.put_nowait(failure if failure is not None else _END)

    def cancel(self) -> None:
        """CancelStream: end the stream now; one that has ended already is let go at once
        (its client wants nothing more of it)."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()
        if self.task is None or self.task.done():
            self._unpark()
            self.resumer.forget(self)

    async def attach(self, write: Write, start: int = 0, heard: int = 0) -> None:
        """Write the log from entry `start` (less the `heard` samples of its audio) and then
        each new event, until the stream has ended and all is written; then return, or raise the
        failure it ended with. Either way the stream is then held for the resume window: the
        client may not have had the last of it (a cut takes what was in flight, and the status).
        A stream that stalled is not held."""
        me = asyncio.current_task()
        assert me is not None and self.task is not None
        if self._attached is not None:
            self._attached.cancel()  # a takeover: that connection is dead, not yet known to be
        self._attached = me
        self._unpark()
        self.log.next_write = start
        self._notify()
        try:
            while not (self.task.done() and (self.log.all_written() or self._ended_for_good())):
                if self.log.all_written():
                    await self._wait(None)
                    continue
                number = self.log.next_write
                event = self.log.event(number)
                self.log.writing(number)
                await self._write(write, heard_cut(event, heard) if number == start else event)
                if self._attached is not me:  # taken over meanwhile: the log is the new call's
                    raise asyncio.CancelledError()
                self.log.wrote(number)
                self._notify()
            self._outcome()
        finally:
            if self._attached is me:
                self._attached = None
                self._park()

    async def _write(self, write: Write, event: SessionEvent) -> None:
        """One write, given up when the stream ends for good meanwhile: stalled (its client
        reads nothing) or cancelled."""
        assert self.task is not None
        writing = asyncio.ensure_future(write(event))
        try:
            await asyncio.wait((writing, self.task), return_when=asyncio.FIRST_COMPLETED)
            if not writing.done() and self._ended_for_good():
                self._outcome()
            await writing
        finally:
            writing.cancel()

    def _park(self) -> None:
        self._notify()
        if self.task is None or self.cancelled or (self.task.done() and self._ended_for_good()):
            self.resumer.forget(self)
            return
        if not self.known_to_client or self.resumer.draining:  # none could resume it
            self.resumer.forget(self)
            self.cancel()
            return
        window = self.resumer.window_s
        self._expiry = asyncio.get_running_loop().call_later(window, self.expire)

    def _outcome(self) -> None:
        """The ended stream's failure raised for the call (a cancelled one: CANCELLED, since
        a handler that raised CancelledError would end its call with no status at all)."""
        assert self.task is not None
        if self.task.cancelled():
            raise ResumeError("CANCELLED", "the stream was cancelled (CancelStream, or a drain)")
        self.task.result()

    def _ended_for_good(self) -> bool:
        """Ended with nothing a resume could give: cancelled (CancelStream, the drain's grace
        passed), or stalled (its client read nothing)."""
        assert self.task is not None
        return self.task.cancelled() or self._stalled()

    def _stalled(self) -> bool:
        """The stream ended because its attached client read nothing."""
        task = self.task
        assert task is not None and task.done()
        return not task.cancelled() and isinstance(task.exception(), ClientStalledError)

    def _unpark(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    @property
    def parked(self) -> bool:
        return self._expiry is not None

    def expire(self) -> None:
        self._expiry = None
        self.resumer.forget(self)
        self.cancel()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self, timeout_s: float | None) -> bool:
        """Wait for the next change; False if `timeout_s` passed first."""
        changed = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            return False
        return True


class Resumer:
    """The resumable streams of this process, their tokens and their windows."""

    def __init__(self, window_s: float, stall_timeout_s: float, metrics: Metrics) -> None:
        self.window_s = window_s
        self.stall_timeout_s = stall_timeout_s
        self.metrics = metrics
        self.tag = secrets.token_hex(4)
        self._key = secrets.token_bytes(32)
        self._streams: dict[str, ResumableStream] = {}
        self.draining = False
        """The doors are shut: no resume can reach this process any more."""
        metrics.parked_streams.set_function(lambda: self.parked)

    def new_id(self) -> str:
        """A stream id of this process, not yet any stream's (the WebSocket names it in its
        upgrade response, for a proxy to stick on, before it knows the stream is resumable)."""
        return f"{self.tag}-{secrets.token_hex(12)}"

    def open(self, authorization: str | None, stream_id: str | None = None) -> ResumableStream:
        """A new resumable stream, under `stream_id` if given (one `new_id` made)."""
        stream_id = stream_id or self.new_id()
        stream = ResumableStream(self, stream_id, self._token(stream_id, authorization))
        self._streams[stream_id] = stream
        return stream

    def resume(
        self, stream_id: str, token: str, authorization: str | None, heard: int, events: int
    ) -> tuple[ResumableStream, int, int]:
        """The stream a resume names, for this caller, and where in its log the listener who
        has `heard` samples and `events` later events goes on (`ReplayLog.seek`): the stream,
        the first entry to write and the samples of it already heard. ResumeError otherwise."""
        stream = self.find(stream_id, token, authorization)
        start, cut = stream.log.seek(heard, events)
        return stream, start, cut

    def find(self, stream_id: str, token: str, authorization: str | None) -> ResumableStream:
        """The stream a ResumeStream names, for this caller (ResumeError otherwise)."""
        try:
            if not stream_id.startswith(f"{self.tag}-"):
                raise ResumeError(
                    "NOT_FOUND",
                    f"stream {stream_id[:64]!r} is not held here: another replica, or this one "
                    "before a restart, began it",
                )
            if not hmac.compare_digest(self._token(stream_id, authorization), token):
                raise ResumeError(
                    "PERMISSION_DENIED", "the resume token is not valid for this stream and caller"
                )
            stream = self._streams.get(stream_id)
            if stream is None:
                raise ResumeError(
                    "NOT_FOUND",
                    f"stream {stream_id!r} is no longer held: its resume window "
                    f"({self.window_s:g} s, --resume-window-s) has passed",
                )
        except ResumeError as exc:
            self.metrics.resumed(exc.status.lower())
            raise
        self.metrics.resumed("ok")
        return stream

    def headers(self, stream: ResumableStream) -> tuple[tuple[str, str], ...]:
        return (
            (STREAM_ID_HEADER, stream.stream_id),
            (TOKEN_HEADER, stream.token),
            (WINDOW_HEADER, f"{self.window_s:g}"),
            (TEXT_SEQ_HEADER, str(stream.last_seq)),
        )

    def drain(self) -> None:
        """The server drains: parked streams are cancelled now (their slots freed), and a
        stream whose connection drops from here on is cancelled at once."""
        self.draining = True
        for stream in list(self._streams.values()):
            if stream.parked:
                stream.expire()

    def forget(self, stream: ResumableStream) -> None:
        if self._streams.get(stream.stream_id) is stream:
            del self._streams[stream.stream_id]

    @property
    def parked(self) -> int:
        """Streams held for a resume, with no call attached (the `chattts_parked_streams`
        gauge)."""
        return sum(stream.parked for stream in self._streams.values())

    @property
    def held(self) -> int:
        """Streams held for a call or a resume (tests, metrics)."""
        return len(self._streams)

    def _token(self, stream_id: str, authorization: str | None) -> str:
        message = f"{stream_id}\0{authorization or ''}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:32]
