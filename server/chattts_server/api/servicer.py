"""chattts.v1.TextToSpeech servicer: validate, admit, call the engine, encode. No tensor code."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from chattts_client._proto.chattts.v1 import tts_pb2, tts_pb2_grpc

from ..config import AdmissionConfig, LimitsConfig
from ..engine.types import Engine, EngineError, EngineUnavailableError, InvalidRequestError
from ..metrics import Metrics
from ..text_buffer import SentenceBuffer, split_sentences
from ..voices import VoiceLibrary
from .admission import Admission, AdmissionRejected
from .convert import FieldError, Validator
from .errors import abort_invalid, abort_resource_exhausted
from .session import Reply, Session

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Message)

_END = object()


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class TextToSpeechServicer(tts_pb2_grpc.TextToSpeechServicer):
    def __init__(
        self,
        engine: Engine,
        validator: Validator,
        voices: VoiceLibrary,
        admission: Admission,
        limits: LimitsConfig,
        admission_config: AdmissionConfig,
        metrics: Metrics,
    ) -> None:
        self.engine = engine
        self.validator = validator
        self.voices = voices
        self.admission = admission
        self.limits = limits
        self.admission_config = admission_config
        self.metrics = metrics

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
        if not self.admission.accepting:
            await self._refuse_unavailable(context, "Synthesize")
        try:
            text = self.validator.text(request.text, "text")
            settings = self.validator.settings(request.config)
        except FieldError as exc:
            await self._refuse_invalid(context, "Synthesize", exc)
            return
        async with self._admitted(context, "Synthesize") as stream:
            session = Session(self.engine, settings, _deadline(context))
            async for reply in self._run(
                session,
                _sentences(split_sentences(text, self.limits.max_sentence_chars)),
                context,
                stream,
            ):
                yield _synthesize_response(reply)

    async def StreamingSynthesize(
        self,
        request_iterator: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tts_pb2.StreamingSynthesizeResponse]:
        if not self.admission.accepting:
            await self._refuse_unavailable(context, "StreamingSynthesize")
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except FieldError as exc:
            await self._refuse_invalid(context, "StreamingSynthesize", exc)
            return
        try:
            if first.WhichOneof("request") != "config":
                raise FieldError("config", "the first message of the stream must carry config")
            settings = self.validator.settings(first.config)
        except FieldError as exc:
            await self._refuse_invalid(context, "StreamingSynthesize", exc)
            return
        async with self._admitted(context, "StreamingSynthesize") as stream:
            session = Session(self.engine, settings, _deadline(context))
            queue: asyncio.Queue[object] = asyncio.Queue()
            reader = asyncio.create_task(self._read_text(request_iterator, queue))
            try:
                async for reply in self._run(session, _drain(queue), context, stream):
                    yield _streaming_response(reply)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    # -- plumbing --------------------------------------------------------------------------

    async def _refuse_invalid(
        self, context: grpc.aio.ServicerContext, method: str, exc: FieldError
    ) -> None:
        """Refuse before admission; still counted and logged like any other stream."""
        _StreamRecord(self.metrics, method).finish("INVALID_ARGUMENT")
        await abort_invalid(context, exc)

    async def _refuse_unavailable(self, context: grpc.aio.ServicerContext, method: str) -> None:
        _StreamRecord(self.metrics, method).finish("UNAVAILABLE")
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "server is not accepting streams (starting or draining)"
        )

    async def _read_text(
        self,
        request_iterator: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        queue: asyncio.Queue[object],
    ) -> None:
        """Read text messages into sentences; a FieldError ends the stream with it."""
        buffer = SentenceBuffer(self.limits.max_sentence_chars)
        total_chars = 0
        try:
            async for message in request_iterator:
                which = message.WhichOneof("request")
                if which == "config":
                    raise FieldError("config", "config may be sent only once, as the first message")
                if which != "text":
                    raise FieldError("text", "every message after the config must carry text")
                text = message.text.text
                self.validator.text(text, "text.text", allow_empty=message.text.flush)
                total_chars += len(text)
                if total_chars > self.limits.max_stream_chars:
                    raise FieldError(
                        "text.text",
                        f"the stream sent over {self.limits.max_stream_chars} characters in total",
                    )
                for sentence in buffer.feed(text):
                    queue.put_nowait(sentence)
                if message.text.flush:
                    for sentence in buffer.flush():
                        queue.put_nowait(sentence)
            for sentence in buffer.flush():
                queue.put_nowait(sentence)
            queue.put_nowait(_END)
        except FieldError as exc:
            queue.put_nowait(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-read, or sent garbage
            log.debug("request stream ended: %r", exc)
            queue.put_nowait(_END)

    async def _run(
        self,
        session: Session,
        sentences: AsyncIterator[object],
        context: grpc.aio.ServicerContext,
        stream: _StreamRecord,
    ) -> AsyncIterator[Reply]:
        """Speak each sentence in turn; map failures to statuses."""
        try:
            async for item in sentences:
                if isinstance(item, FieldError):
                    await abort_invalid(context, item)
                    return
                assert isinstance(item, str)
                async for reply in session.speak(item):
                    stream.on_reply(reply)
                    yield reply
            for reply in session.finish():
                yield reply
        except InvalidRequestError as exc:
            await abort_invalid(context, FieldError(exc.field_name, exc.description))
        except EngineUnavailableError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except EngineError as exc:
            log.error("stream %s failed in the engine: %s", session.stream_id, exc)
            await context.abort(grpc.StatusCode.INTERNAL, f"synthesis failed: {exc}")
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

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
                    record.finish("OK")
                except asyncio.CancelledError:
                    record.finish("CANCELLED")
                    raise
                except BaseException as exc:
                    record.finish(_status_name(context, exc))
                    raise
        except AdmissionRejected as exc:
            self.metrics.rejected(exc.code)
            if exc.code == "exhausted":
                await abort_resource_exhausted(
                    context, str(exc), self.admission_config.retry_pushback_ms
                )
            else:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded while queued")


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
            await abort_invalid(context, exc)
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
            await abort_invalid(context, exc)
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

    def on_reply(self, reply: Reply) -> None:
        now = time.monotonic()
        if isinstance(reply, tts_pb2.AudioChunk):
            if self.first_audio_s is None:
                self.first_audio_s = now - self.started
                self.metrics.observe_ttfa(self.first_audio_s)
            elif self.last_chunk_at is not None:
                self.metrics.observe_chunk_gap(now - self.last_chunk_at)
            self.last_chunk_at = now
            self.num_chunks += 1
        else:
            self.audio_s += reply.audio_duration_s
            self.num_tokens += reply.num_tokens
            self.metrics.observe_utterance(
                reply.generation_time_s, reply.audio_duration_s, reply.num_tokens
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


def _status_name(context: grpc.aio.ServicerContext, exc: BaseException) -> str:
    code = context.code() if hasattr(context, "code") else None
    if code is not None and hasattr(code, "name"):
        return str(code.name)
    return "UNKNOWN" if not isinstance(exc, grpc.RpcError) else "ABORTED"


async def _sentences(items: list[str]) -> AsyncIterator[object]:
    for item in items:
        yield item


async def _drain(queue: asyncio.Queue[object]) -> AsyncIterator[object]:
    while True:
        item = await queue.get()
        if item is _END:
            return
        yield item


def _synthesize_response(reply: Reply) -> tts_pb2.SynthesizeResponse:
    if isinstance(reply, tts_pb2.AudioChunk):
        return tts_pb2.SynthesizeResponse(audio=reply)
    return tts_pb2.SynthesizeResponse(utterance_end=reply)


def _streaming_response(reply: Reply) -> tts_pb2.StreamingSynthesizeResponse:
    if isinstance(reply, tts_pb2.AudioChunk):
        return tts_pb2.StreamingSynthesizeResponse(audio=reply)
    return tts_pb2.StreamingSynthesizeResponse(utterance_end=reply)
