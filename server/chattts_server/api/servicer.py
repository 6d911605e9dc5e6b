"""chattts.v1.TextToSpeech servicer: decode protobuf, call the shared synthesis path
(api/synthesis.py, the same one the HTTP front door calls), encode protobuf. No tensor code."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

from .admission import AdmissionRejected
from .convert import FieldError
from .errors import abort_with, is_ours
from .events import AudioOut, SessionEvent, to_pb
from .synthesis import Synthesis
from .text_reader import TextFragment

_M = TypeVar("_M", bound=Message)
_R = TypeVar("_R")


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class TextToSpeechServicer(tts_pb2_grpc.TextToSpeechServicer):
    def __init__(self, synthesis: Synthesis) -> None:
        self.synthesis = synthesis

    async def _abort(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        await abort_with(context, exc, self.synthesis.admission_config.retry_pushback_ms)

    async def _replies(
        self,
        events: AsyncGenerator[SessionEvent, None],
        to_reply: Callable[[SessionEvent], _R],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[_R]:
        """The stream's events as replies; our own failures end the call with their status."""
        try:
            async with aclosing(events):
                async for event in events:
                    yield to_reply(event)
        except Exception as exc:
            if not is_ours(exc):
                raise
            await self._abort(context, exc)

    # -- RPCs ------------------------------------------------------------------------------

    async def ListVoices(
        self, request: tts_pb2.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListVoicesResponse:
        return tts_pb2.ListVoicesResponse(
            voices=[
                tts_pb2.VoiceInfo(name=p.name, description=p.description)
                for p in self.synthesis.voices.list()
            ]
        )

    async def Synthesize(
        self, request: tts_pb2.SynthesizeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        synthesis = self.synthesis
        try:
            synthesis.check_accepting()
            text = synthesis.validator.text(request.text, "text")
            settings = synthesis.validator.settings(request.config)
        except (FieldError, AdmissionRejected) as exc:
            synthesis.refused("Synthesize", exc)
            await self._abort(context, exc)
            return
        events = synthesis.synthesize(
            "Synthesize",
            text,
            settings,
            deadline=_deadline(context),
            queue_timeout_s=context.time_remaining(),
        )
        async for reply in self._replies(events, _synthesize_response, context):
            yield reply

    async def StreamingSynthesize(
        self,
        request_iterator: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tts_pb2.StreamingSynthesizeResponse]:
        synthesis = self.synthesis
        try:
            synthesis.check_accepting()
            first = await anext(aiter(request_iterator))
            if first.WhichOneof("request") != "config":
                raise FieldError("config", "the first message of the stream must carry config")
            settings = synthesis.validator.settings(first.config)
        except StopAsyncIteration:
            return
        except (FieldError, AdmissionRejected) as exc:
            synthesis.refused("StreamingSynthesize", exc)
            await self._abort(context, exc)
            return
        events = synthesis.stream(
            "StreamingSynthesize",
            _fragments(request_iterator),
            settings,
            deadline=_deadline(context),
            queue_timeout_s=context.time_remaining(),
        )
        async for reply in self._replies(events, _streaming_response, context):
            yield reply


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


def _synthesize_response(event: SessionEvent) -> tts_pb2.SynthesizeResponse:
    if isinstance(event, AudioOut):
        return tts_pb2.SynthesizeResponse(audio=to_pb(event))
    return tts_pb2.SynthesizeResponse(utterance_end=to_pb(event))


def _streaming_response(event: SessionEvent) -> tts_pb2.StreamingSynthesizeResponse:
    if isinstance(event, AudioOut):
        return tts_pb2.StreamingSynthesizeResponse(audio=to_pb(event))
    return tts_pb2.StreamingSynthesizeResponse(utterance_end=to_pb(event))
