"""The one way in, under every front door (gRPC servicer, HTTP speech route, WebSocket).

A door translates its wire format and nothing else. It calls `Synthesis.accept` with its
method name, the client's `Authorization` value and a `parse` coroutine that reads its request
(a protobuf, a POST body, the WebSocket's config frame) into what to speak; `accept` checks the
bearer token, refuses while starting or draining, runs `parse` against the validator, and counts
and logs every refusal as a refused stream. The door then calls `Synthesis.synthesize` (one
text) or `Synthesis.stream` (text fragments as they arrive) with a `send` coroutine that writes
one `SessionEvent` to its client. Everything between is here, once: admission (one `Admission`
shared by all doors), the per-stream record (metrics and the one log line), the text front end
(sentence splitting, or the streamed text reader with its release policy, markdown and
barge-in), the `Stream` (stream/stream.py) that owns the stream's state and speaks it, the
stall timeout, and the status a failure ends the stream with.

Stalled readers: every event is handed to the door's `send` under `--stall-timeout-s`. Each
transport makes a write wait while its client reads nothing (grpc.aio's `context.write` on
HTTP/2 flow control, uvicorn's `send` on the socket's write buffer, the WebSocket's `send` the
same), and while a write waits nothing is taken from the session, so the engine pauses the
request once its bounded output buffer is full (`engine.py`, `is_paused`). A write that waits
longer than the timeout ends the stream with ClientStalledError: the engine request is
cancelled and the admission place freed before the door reports it. A stream waiting for text
writes nothing and is never stalled; a client that keeps up with real time has its writes done
as fast as it plays the audio.

Failures are raised as our own exceptions (`errors.OURS`); each door maps them to its protocol
once (`errors.abort_with` for gRPC, `http/errors.http_failure` for HTTP).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager, contextmanager
from typing import TypeVar

from ..audio.containers import CONTAINER_ENCODINGS
from ..audio.encoding import SUPPORTED_ENCODINGS, available_encodings
from ..config import AdmissionConfig, LimitsConfig
from ..engine.protocol import Engine, ModelInfo
from ..engine.utterance import Priority
from ..errors import InvalidRequestError
from ..metrics import Metrics
from ..stream.events import SessionEvent
from ..stream.items import Speak, StreamItem
from ..stream.reader import Inbox, TextFragment, read_text
from ..stream.settings import StreamSettings
from ..stream.ssml_text import ssml_stream_items
from ..stream.stream import Stream
from ..text.lexicon import apply_lexicons
from ..text.lexicon_library import LexiconLibrary
from ..text.stream import utterances_traced
from ..timing.types import ESTIMATE
from . import auth
from .admission import NOT_READY, Admission, AdmissionRejected
from .convert import Validator
from .errors import ClientGoneError, ClientStalledError, is_ours, status_name
from .resume import Resumer
from .stream_record import StreamRecord
from .voices import VoiceLibrary

log = logging.getLogger(__name__)

Send = Callable[[SessionEvent], Awaitable[None]]
"""A door's write of one event to its client; it waits while the client is not reading."""
_T = TypeVar("_T")


class Synthesis:
    """Accepting, auth, admission and the synthesis path, shared by every front door."""

    def __init__(
        self,
        engine: Engine,
        voices: VoiceLibrary,
        admission: Admission,
        limits: LimitsConfig,
        admission_config: AdmissionConfig,
        metrics: Metrics,
        tokens: auth.Tokens | None = None,
        server_lexicons: LexiconLibrary | None = None,
    ) -> None:
        self.engine = engine
        self.voices = voices
        self.admission = admission
        self.limits = limits
        self.admission_config = admission_config
        self.metrics = metrics
        self.tokens = tokens
        """The accepted bearer tokens; None when auth is off."""
        self.server_lexicons = server_lexicons or LexiconLibrary()
        """The server's pronunciation lexicons (--lexicon)."""
        self._validator: Validator | None = None
        self.resumer = (
            Resumer(limits.resume_window_s, limits.stall_timeout_s, metrics)
            if limits.resume_window_s
            else None
        )
        """The resumable streams of every door; None with --resume-window-s 0."""
        self.socket_streams = 0
        """WebSocket streams (and contexts) begun whose last message is not yet written."""

    @contextmanager
    def socket_stream(self) -> Iterator[None]:
        """A WebSocket stream from its start to its last message and close: a drain waits for
        these before it stops the HTTP server (`TTSServer.drain`), since a stream's slot is
        freed before its last messages (`done`, `context_closed`) go out."""
        self.socket_streams += 1
        try:
            yield
        finally:
            self.socket_streams -= 1

    def use_lexicons(self, library: LexiconLibrary) -> None:
        """The server's lexicons from now on (SIGHUP reloaded them). A stream takes them when it
        is accepted, so streams already accepted keep reading through the ones before."""
        self.server_lexicons = library
        if self._validator is not None:
            self._validator = dataclasses.replace(self._validator, server_lexicons=library)

    def bind_model(self, model: ModelInfo, encodings: tuple[str, ...] | None = None) -> None:
        """The model is loaded: validate requests against it (before this, nothing is admitted).
        `encodings`: what this server can write; by default the one capability check,
        `available_encodings`, over the stream encodings and the HTTP containers."""
        if encodings is None:
            encodings = available_encodings(SUPPORTED_ENCODINGS + CONTAINER_ENCODINGS)
        self._validator = Validator(
            self.voices,
            model,
            max_text_chars=self.limits.max_text_chars,
            encodings=encodings,
            server_lexicons=self.server_lexicons,
        )
        if model.timing_source == ESTIMATE:
            log.info(
                "word timing (when a stream asks): source %s, the utterance's audio shared out "
                "by the duration model and snapped to its pauses (no attention alignment)",
                ESTIMATE,
            )
        else:
            log.info(
                "word timing (when a stream asks): source %s, the alignment heads chosen at "
                "warm-up (a cleared utterance: the estimate)",
                model.timing_source,
            )

    @property
    def validator(self) -> Validator:
        """The request validator; AdmissionRejected('unavailable') while the model loads."""
        if self._validator is None:
            raise AdmissionRejected("unavailable", "the model is still loading")
        return self._validator

    @property
    def model(self) -> ModelInfo:
        return self.validator.model

    @property
    def retry_pushback_ms(self) -> int:
        return self.admission_config.retry_pushback_ms

    def check_token(self, authorization: str | None, what: str) -> None:
        """The bearer-token check (AuthError), for what is not a stream (voices, models)."""
        auth.check(self.tokens, authorization, what)

    # -- the way in ------------------------------------------------------------------------

    async def accept(
        self,
        method: str,
        authorization: str | None,
        parse: Callable[[Validator], Awaitable[_T]],
    ) -> _T:
        """Token, then ready, then the door's `parse` of its request against the
        validator. A refusal (our exceptions) is counted and logged as a refused stream of
        `method`, then raised; ClientGoneError (the client left before its request was read)
        is raised uncounted."""
        try:
            auth.check(self.tokens, authorization, method)
            if not self.admission.ready:
                raise AdmissionRejected("unavailable", NOT_READY)
            return await parse(self.validator)
        except ClientGoneError:
            raise
        except Exception as exc:
            if is_ours(exc):
                self.refused(method, exc)
            raise

    def refused(self, method: str, exc: BaseException) -> None:
        """A stream refused before admission: counted and logged like any other stream."""
        StreamRecord(self.metrics, method).finish(status_name(exc))

    async def synthesize(
        self,
        method: str,
        text: str,
        settings: StreamSettings,
        send: Send,
        *,
        deadline: float | None = None,
        queue_timeout_s: float | None = None,
        text_field: str = "text",
    ) -> StreamRecord:
        """One text (validated already), read as markdown or plain text by the settings and
        split into sentences, spoken in turn; InvalidRequestError naming `text_field` if
        nothing is left to read. Returns the stream's record once all is sent."""
        try:
            items = _whole_text_items(text, settings, text_field)
        except InvalidRequestError as exc:
            self.refused(method, exc)
            raise
        async with self._admitted(method, queue_timeout_s, settings.priority) as record:
            await self._run(Stream(self.engine, settings, deadline, items=items), record, send)
        return record

    async def stream(
        self,
        method: str,
        fragments: AsyncIterator[TextFragment],
        settings: StreamSettings,
        send: Send,
        *,
        deadline: float | None = None,
        queue_timeout_s: float | None = None,
        guard_stalls: bool = True,
    ) -> StreamRecord:
        """Streamed text: the fragments are read by the text reader (release policy, markdown,
        barge-in, segments) while released utterances are spoken. The reader starts before
        admission, so the time each message reaches the server is known while the stream waits
        (a segment's expiry counts from it). The fragments end when the client has sent
        everything; a fragment source that raises ends the stream with that failure.
        `guard_stalls=False`: `send` raises ClientStalledError itself (a resumable stream's,
        which waits without limit while its connection is down)."""
        inbox: Inbox = asyncio.Queue()
        reader = asyncio.create_task(
            read_text(fragments, inbox, self.validator, self.limits.max_stream_chars)
        )
        try:
            async with self._admitted(method, queue_timeout_s, settings.priority) as record:
                stream = Stream(self.engine, settings, deadline, inbox)
                await self._run(stream, record, send, guard_stalls)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        return record

    async def deliver(self, sending: Awaitable[None]) -> None:
        """Await one write to the client under the stall timeout: ClientStalledError when it
        waits longer (doors also send their own last messages through this)."""
        timeout_s = self.limits.stall_timeout_s
        if not timeout_s:
            await sending
            return
        try:
            async with asyncio.timeout(timeout_s) as scope:
                await sending
        except TimeoutError:
            if not scope.expired():
                raise
            raise ClientStalledError(
                f"stalled: the client took no audio for {timeout_s:g} s "
                "(--stall-timeout-s); the stream was cancelled"
            ) from None

    # -- inside --------------------------------------------------------------------------

    async def _run(
        self, stream: Stream, record: StreamRecord, send: Send, guard_stalls: bool = True
    ) -> None:
        """Hand each of the stream's events to `send` under the stall timeout (unless
        `guard_stalls` is off); a failure sets the record's status and is raised."""
        try:
            async with aclosing(stream.events()) as events:
                async for event in events:
                    record.on_event(event)
                    await (self.deliver(send(event)) if guard_stalls else send(event))
        except Exception as exc:
            record.status = status_name(exc)
            if isinstance(exc, ClientStalledError):
                self.metrics.stalled(record.method)
                log.info("stream %s (%s): %s", stream.stream_id, record.method, exc)
            elif record.status == "INTERNAL":
                log.error("stream %s failed in the engine: %s", stream.stream_id, exc)
            raise

    @asynccontextmanager
    async def _admitted(
        self, method: str, timeout_s: float | None, priority: Priority
    ) -> AsyncIterator[StreamRecord]:
        """Hold an admission place for the stream (queued by `priority`); refuse fast
        (AdmissionRejected) when full or not serving, TimeoutError when `timeout_s` passes in
        the queue."""
        record = StreamRecord(self.metrics, method, priority)
        admitted = False
        try:
            async with self.admission.stream(timeout_s, priority):
                admitted = True
                self.metrics.streams_started(method)
                try:
                    yield record
                except BaseException as exc:
                    if record.status == "OK":  # cancelled, the client went away, or a bug
                        record.status = status_name(exc)
                    raise
                finally:
                    record.finish(record.status)
        except AdmissionRejected as exc:
            if admitted:
                raise
            self.metrics.rejected(exc.code)
            record.finish(status_name(exc))
            raise
        except TimeoutError:
            if admitted:
                raise
            record.finish("DEADLINE_EXCEEDED")
            raise TimeoutError("deadline exceeded while queued") from None


def _whole_text_items(text: str, settings: StreamSettings, text_field: str) -> list[StreamItem]:
    """A whole text's stream items: an SSML document's utterances, silences and marks, or the
    sentences of markdown or plain text; InvalidRequestError naming `text_field` when it cannot
    be read or nothing is left to say."""
    s = settings
    max_s = s.text_release.max_segment_s
    if s.ssml:
        items = ssml_stream_items(
            text, max_s, s.speed, s.ssml_ignore_unknown, text_field, s.lexicons, s.server_lexicons
        )
        if not items:
            raise InvalidRequestError(text_field, "holds nothing to speak: an empty SSML document")
        return items
    sentences = utterances_traced(text, max_s, s.speed, s.markdown)
    if not sentences:
        raise InvalidRequestError(text_field, "holds nothing to read once markdown is removed")
    return [
        Speak(apply_lexicons(s.lexicons, u), text[span[0] : span[1]] if (span := u.span()) else "")
        for u in sentences
    ]
