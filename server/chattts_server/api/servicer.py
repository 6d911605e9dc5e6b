"""chattts.v1.TextToSpeech servicer: validate, admit, call the engine, encode. No tensor code."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from chattts_client._proto.chattts.v1 import tts_pb2, tts_pb2_grpc

from ..config import AdmissionConfig, LimitsConfig
from ..engine.types import Engine, ModelInfo
from ..metrics import Metrics
from ..text.stream import utterances
from ..voices import VoiceLibrary
from .admission import Admission, AdmissionRejected
from .convert import FieldError, StreamSettings, Validator
from .errors import abort_with, is_ours, status_of
from .events import AudioOut, SessionEvent, to_pb
from .session import Session
from .text_reader import TextFragment, read_text

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Message)

_END = object()
_NOT_ACCEPTING = "server is not accepting streams (starting or draining)"


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class TextToSpeechServicer(tts_pb2_grpc.TextToSpeechServicer):
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
        self._validator: Validator | None = None
        self.voices = voices
        self.admission = admission
        self.limits = limits
        self.admission_config = admission_config
        self.metrics = metrics

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
        if self._validator is None:
            raise AdmissionRejected("unavailable", "the model is still loading")
        return self._validator

    # -- RPCs ------------------------------------------------------------------------------

    async def ListVoices(
        self, request: tts_pb2.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListVoicesResponse:
        return tts_pb2.ListVoicesResponse(
            voices=[
                tts_pb2.VoiceInfo(name=p.name, description=p.description)
                for p in self.voices.list()
            ]
        )

    async def Synthesize(
        self, request: tts_pb2.SynthesizeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        try:
            if not self.admission.accepting:
                raise AdmissionRejected("unavailable", _NOT_ACCEPTING)
            text = self.validator.text(request.text, "text")
            settings = self.validator.settings(request.config)
            sentences = utterances(
                text, settings.text_release.max_segment_s, settings.speed, settings.markdown
            )
            if not sentences:
                raise FieldError("text", "holds nothing to read once markdown is removed")
        except (FieldError, AdmissionRejected) as exc:
            await self._refuse(context, "Synthesize", exc)
            return
        async with self._admitted(context, "Synthesize") as stream:
            session = Session(self.engine, settings, _deadline(context))
            async for event in self._run(
                session,
                _sentences(sentences),
                context,
                stream,
            ):
                yield _synthesize_response(event)

    async def StreamingSynthesize(
        self,
        request_iterator: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tts_pb2.StreamingSynthesizeResponse]:
        try:
            if not self.admission.accepting:
                raise AdmissionRejected("unavailable", _NOT_ACCEPTING)
            first = await anext(aiter(request_iterator))
            if first.WhichOneof("request") != "config":
                raise FieldError("config", "the first message of the stream must carry config")
            settings = self.validator.settings(first.config)
        except StopAsyncIteration:
            return
        except (FieldError, AdmissionRejected) as exc:
            await self._refuse(context, "StreamingSynthesize", exc)
            return
        async with self._admitted(context, "StreamingSynthesize") as stream:
            session = Session(self.engine, settings, _deadline(context))
            queue: asyncio.Queue[object] = asyncio.Queue()
            reader = asyncio.create_task(
                self._read_text(request_iterator, queue, settings, session.interrupt)
            )
            try:
                async for event in self._run(session, _drain(queue), context, stream):
                    yield _streaming_response(event)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    # -- plumbing --------------------------------------------------------------------------

    async def _refuse(
        self, context: grpc.aio.ServicerContext, method: str, exc: BaseException
    ) -> None:
        """Refuse before admission; still counted and logged like any other stream."""
        _StreamRecord(self.metrics, method).finish(status_of(exc)[0].name)
        await abort_with(context, exc)

    async def _read_text(
        self,
        request_iterator: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        queue: asyncio.Queue[object],
        settings: StreamSettings,
        on_clear: Callable[[], None],
    ) -> None:
        """Read text messages into utterances by the stream's release policy (text_reader);
        `on_clear` stops the utterance being spoken (barge-in)."""
        await read_text(
            _fragments(request_iterator),
            queue,
            self.validator,
            settings.text_release,
            self.limits.max_stream_chars,
            _END,
            on_clear=on_clear,
            markdown=settings.markdown,
        )

    async def _run(
        self,
        session: Session,
        sentences: AsyncIterator[object],
        context: grpc.aio.ServicerContext,
        stream: _StreamRecord,
    ) -> AsyncIterator[SessionEvent]:
        """Speak each sentence in turn; a failure ends the call with its status."""
        try:
            async for item in sentences:
                if isinstance(item, FieldError):
                    raise item
                assert isinstance(item, str)
                async for event in session.speak(item):
                    stream.on_event(event)
                    yield event
            for event in session.finish():
                stream.on_event(event)
                yield event
        except Exception as exc:
            if not is_ours(exc):
                raise
            stream.status = status_of(exc)[0].name
            if stream.status == "INTERNAL":
                log.error("stream %s failed in the engine: %s", session.stream_id, exc)
            await abort_with(context, exc)

    @asynccontextmanager
    async def _admitted(
        self, context: grpc.aio.ServicerContext, method: str
    ) -> AsyncIterator[_StreamRecord]:
        """Hold an admission place for the call; refuse fast when full or not serving."""
        record = _StreamRecord(self.metrics, method)
        try:
            async with self.admission.stream(context.time_remaining()):
                self.metrics.streams_started(method)
                try:
                    yield record
                except BaseException as exc:
                    # An abort already set the status; otherwise: cancelled, or a bug.
                    if record.status == "OK":
                        record.status = status_of(exc)[0].name
                    record.finish(record.status)
                    raise
                record.finish(record.status)
        except AdmissionRejected as exc:
            self.metrics.rejected(exc.code)
            record.finish(status_of(exc)[0].name)
            await abort_with(context, exc, self.admission_config.retry_pushback_ms)
        except TimeoutError:
            record.finish("DEADLINE_EXCEEDED")
            await abort_with(context, TimeoutError("deadline exceeded while queued"))


def _parse(message_type: type[_M], data: bytes, field_name: str) -> _M:
    """Parse request bytes ourselves: grpcio answers UNKNOWN with the exception text otherwise."""
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise FieldError(
            field_name, f"is not a valid {message_type.DESCRIPTOR.name}: {str(exc)[-80:]}"
        ) from None


async def _parsed(
    request_iterator: AsyncIterator[bytes],
) -> AsyncIterator[tts_pb2.StreamingSynthesizeRequest]:
    async for data in request_iterator:
        yield _parse(tts_pb2.StreamingSynthesizeRequest, data, "request")


def add_to_server(servicer: TextToSpeechServicer, server: grpc.aio.Server) -> None:
    """Register the servicer like the generated helper, but parsing requests inside the handler
    so malformed bytes (e.g. invalid UTF-8 in a string field) get INVALID_ARGUMENT, not UNKNOWN."""

    async def synthesize(
        data: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        try:
            request = _parse(tts_pb2.SynthesizeRequest, data, "request")
        except FieldError as exc:
            await abort_with(context, exc)
            return
        async for reply in servicer.Synthesize(request, context):
            yield reply

    async def streaming(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tts_pb2.StreamingSynthesizeResponse]:
        async for reply in servicer.StreamingSynthesize(_parsed(requests), context):
            yield reply

    async def list_voices(
        data: bytes, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListVoicesResponse:
        try:
            request = _parse(tts_pb2.ListVoicesRequest, data, "request")
        except FieldError as exc:
            await abort_with(context, exc)
            raise AssertionError("unreachable") from None
        return await servicer.ListVoices(request, context)

    handlers = {
        "StreamingSynthesize": grpc.stream_stream_rpc_method_handler(
            streaming, response_serializer=tts_pb2.StreamingSynthesizeResponse.SerializeToString
        ),
        "Synthesize": grpc.unary_stream_rpc_method_handler(
            synthesize, response_serializer=tts_pb2.SynthesizeResponse.SerializeToString
        ),
        "ListVoices": grpc.unary_unary_rpc_method_handler(
            list_voices, response_serializer=tts_pb2.ListVoicesResponse.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("chattts.v1.TextToSpeech", handlers),)
    )
    server.add_registered_method_handlers("chattts.v1.TextToSpeech", handlers)


class _StreamRecord:
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
        """The status the call ends with, once known."""

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


async def _fragments(
    requests: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
) -> AsyncIterator[TextFragment]:
    """The text messages after the config, as transport-neutral fragments."""
    async for message in requests:
        which = message.WhichOneof("request")
        if which == "config":
            raise FieldError("config", "config may be sent only once, as the first message")
        if which != "text":
            raise FieldError("text", "every message after the config must carry text")
        yield TextFragment(message.text.text, message.text.flush, message.text.clear)


async def _sentences(items: list[str]) -> AsyncIterator[object]:
    for item in items:
        yield item


async def _drain(queue: asyncio.Queue[object]) -> AsyncIterator[object]:
    while True:
        item = await queue.get()
        if item is _END:
            return
        yield item


def _synthesize_response(event: SessionEvent) -> tts_pb2.SynthesizeResponse:
    if isinstance(event, AudioOut):
        return tts_pb2.SynthesizeResponse(audio=to_pb(event))
    return tts_pb2.SynthesizeResponse(utterance_end=to_pb(event))


def _streaming_response(event: SessionEvent) -> tts_pb2.StreamingSynthesizeResponse:
    if isinstance(event, AudioOut):
        return tts_pb2.StreamingSynthesizeResponse(audio=to_pb(event))
    return tts_pb2.StreamingSynthesizeResponse(utterance_end=to_pb(event))
