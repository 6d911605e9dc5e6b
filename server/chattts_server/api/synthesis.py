"""The one synthesis path under every front door (gRPC servicer, HTTP speech route, WebSocket).

A front door decodes its wire format into `StreamSettings` and text (one string, or an async
iterator of `TextFragment`s), then calls `Synthesis.synthesize` or `Synthesis.stream` and
encodes the `SessionEvent`s it gets back. Everything between is here, once: admission (one
`Admission` shared by all doors), the per-stream record (metrics and the one log line), the
text front end (sentence splitting, or the streamed text reader with its release policy,
markdown handling and barge-in), the `Session` that speaks each utterance, and the status a
failure ends the stream with. Failures are raised as our own exceptions (FieldError,
AdmissionRejected, TimeoutError, EngineError); each door maps them to its protocol once
(`errors.abort_with` for gRPC, `http_errors` for HTTP).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager

from ..config import AdmissionConfig, LimitsConfig
from ..engine.types import Engine, ModelInfo
from ..metrics import Metrics
from ..text.stream import utterances
from ..voices import VoiceLibrary
from .admission import Admission, AdmissionRejected
from .convert import FieldError, StreamSettings, Validator
from .errors import is_ours, status_of
from .events import AudioOut, SessionEvent
from .session import Session
from .text_reader import EndOfText, TextFragment, UtteranceQueue, read_text

log = logging.getLogger(__name__)

NOT_ACCEPTING = "server is not accepting streams (starting or draining)"


def status_name(exc: BaseException) -> str:
    """The canonical status (gRPC's names, also the metrics label) a failure ends a stream with."""
    return status_of(exc)[0].name


class Synthesis:
    """Admission, validation state and the synthesis path, shared by every front door."""

    def __init__(
        self,
        engine: Engine,
        voices: VoiceLibrary,
        admission: Admission,
        limits: LimitsConfig,
        admission_config: AdmissionConfig,
        metrics: Metrics,
    ) -> None:
        self.engine = engine
        self.voices = voices
        self.admission = admission
        self.limits = limits
        self.admission_config = admission_config
        self.metrics = metrics
        self._validator: Validator | None = None

    def bind_model(self, model: ModelInfo, supported_encodings: tuple[str, ...]) -> None:
        """The model is loaded: validate requests against it (before this, nothing is admitted)."""
        self._validator = Validator(
            self.voices,
            model,
            max_text_chars=self.limits.max_text_chars,
            supported_encodings=supported_encodings,
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

    def check_accepting(self) -> None:
        """AdmissionRejected('unavailable') while starting or draining."""
        if not self.admission.accepting:
            raise AdmissionRejected("unavailable", NOT_ACCEPTING)
        self.validator  # noqa: B018 - raises while the model loads

    def refused(self, method: str, reason: BaseException | str) -> None:
        """A stream refused before admission (bad request, not accepting, no token; `reason`
        is the failure or its status name): still counted and logged like any other stream."""
        status = reason if isinstance(reason, str) else status_name(reason)
        StreamRecord(self.metrics, method).finish(status)

    async def synthesize(
        self,
        method: str,
        text: str,
        settings: StreamSettings,
        *,
        deadline: float | None = None,
        queue_timeout_s: float | None = None,
        text_field: str = "text",
    ) -> AsyncGenerator[SessionEvent, None]:
        """One text (validated already), read as markdown or plain text by the settings and
        split into sentences, spoken in turn; FieldError naming `text_field` if nothing is
        left to read."""
        s = settings
        sentences = utterances(text, s.text_release.max_segment_s, s.speed, s.markdown)
        if not sentences:
            exc = FieldError(text_field, "holds nothing to read once markdown is removed")
            self.refused(method, exc)
            raise exc
        async with self._admitted(method, queue_timeout_s) as record:
            session = Session(self.engine, settings, deadline)
            async with aclosing(self._run(session, _items(sentences), record)) as events:
                async for event in events:
                    yield event

    async def stream(
        self,
        method: str,
        fragments: AsyncIterator[TextFragment],
        settings: StreamSettings,
        *,
        deadline: float | None = None,
        queue_timeout_s: float | None = None,
    ) -> AsyncGenerator[SessionEvent, None]:
        """Streamed text: the fragments are read by the text reader (release policy, markdown,
        barge-in) while released utterances are spoken. The fragments end when the client has
        sent everything; a fragment source that raises FieldError ends the stream with it."""
        async with self._admitted(method, queue_timeout_s) as record:
            session = Session(self.engine, settings, deadline)
            queue: UtteranceQueue = asyncio.Queue()
            reader = asyncio.create_task(
                read_text(
                    fragments,
                    queue,
                    self.validator,
                    settings.text_release,
                    self.limits.max_stream_chars,
                    on_clear=session.interrupt,
                    markdown=settings.markdown,
                )
            )
            try:
                async with aclosing(self._run(session, _drain(queue), record)) as events:
                    async for event in events:
                        yield event
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _run(
        self, session: Session, items: AsyncIterator[str | FieldError], record: StreamRecord
    ) -> AsyncGenerator[SessionEvent, None]:
        """Speak each utterance in turn; a failure sets the record's status and is raised."""
        try:
            async for item in items:
                if isinstance(item, FieldError):
                    raise item
                async with aclosing(session.speak(item)) as events:
                    async for event in events:
                        record.on_event(event)
                        yield event
            for event in session.finish():
                record.on_event(event)
                yield event
        except Exception as exc:
            if is_ours(exc):
                record.status = status_name(exc)
                if record.status == "INTERNAL":
                    log.error("stream %s failed in the engine: %s", session.stream_id, exc)
            raise

    @asynccontextmanager
    async def _admitted(self, method: str, timeout_s: float | None) -> AsyncIterator[StreamRecord]:
        """Hold an admission place for the stream; refuse fast (AdmissionRejected) when full or
        not serving, TimeoutError when `timeout_s` passes in the queue."""
        record = StreamRecord(self.metrics, method)
        admitted = False
        try:
            async with self.admission.stream(timeout_s):
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


class StreamRecord:
    """Per-stream figures for metrics and the one-line request log."""

    def __init__(self, metrics: Metrics, method: str) -> None:
        self.metrics = metrics
        self.method = method
        self.started = time.monotonic()
        self.last_chunk_at: float | None = None
        self.first_audio_s: float | None = None
        self.num_chunks = 0
        self.audio_s = 0.0
        self.num_tokens = 0
        self.status = "OK"
        """The status the stream ends with, once known."""

    def on_event(self, event: SessionEvent) -> None:
        now = time.monotonic()
        if isinstance(event, AudioOut):
            if self.first_audio_s is None:
                self.first_audio_s = now - self.started
                self.metrics.observe_ttfa(self.first_audio_s)
            elif self.last_chunk_at is not None:
                self.metrics.observe_chunk_gap(now - self.last_chunk_at)
            self.last_chunk_at = now
            self.num_chunks += 1
        else:
            self.audio_s += event.audio_duration_s
            self.num_tokens += event.done.num_tokens
            self.metrics.observe_utterance(
                event.done.generation_time_s, event.audio_duration_s, event.done.num_tokens
            )

    def finish(self, status: str) -> None:
        wall_s = time.monotonic() - self.started
        self.metrics.streams_finished(self.method, status)
        log.info(
            "stream method=%s status=%s chunks=%d audio_s=%.2f wall_s=%.2f ttfa_ms=%s tokens=%d rtf=%s",
            self.method,
            status,
            self.num_chunks,
            self.audio_s,
            wall_s,
            "-" if self.first_audio_s is None else f"{self.first_audio_s * 1000:.0f}",
            self.num_tokens,
            f"{wall_s / self.audio_s:.2f}" if self.audio_s else "-",
        )


async def _items(items: list[str]) -> AsyncIterator[str | FieldError]:
    for item in items:
        yield item


async def _drain(queue: UtteranceQueue) -> AsyncIterator[str | FieldError]:
    while True:
        item = await queue.get()
        if isinstance(item, EndOfText):
            return
        yield item
