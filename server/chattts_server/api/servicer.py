"""chattts.v1.TextToSpeech over gRPC: decode protobuf, take the one way in (api/synthesis.py,
the same one the HTTP doors take), write protobuf. No tensor code.

Requests are parsed here, not by grpcio, so malformed bytes (e.g. invalid UTF-8 in a string
field) get INVALID_ARGUMENT naming the request (grpcio answers UNKNOWN with the exception text)
and only after the token is checked. Replies are written with `context.write`, so the way in
sees each write wait on HTTP/2 flow control while the client reads nothing (the stall timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc._cython.cygrpc import ExecuteBatchError

from chattts_proto.chattts.v1 import tts_pb2

from ..errors import InvalidRequestError
from ..stream.events import SessionEvent
from ..stream.reader import TextFragment
from ..stream.segments import IfStarted
from ..stream.settings import StreamSettings
from .auth import authorization_of
from .convert import Validator
from .errors import ClientGoneError, ClientStalledError, ResumeError, abort_with, is_ours
from .events import reply
from .receipts import ReceiptGate
from .resume import ResumableStream
from .synthesis import Send, Synthesis

_M = TypeVar("_M", bound=Message)

SERVICE = "chattts.v1.TextToSpeech"
_STALLED_STATUS_WAIT_S = 1.0
"""How long a stalled call's handler waits for its status to be taken; the status stays queued
behind the unread audio (the client sees it if it reads again), the handler ends."""


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class TextToSpeechServicer:
    """The RPCs, on raw request bytes (see `add_to_server`)."""

    def __init__(self, synthesis: Synthesis) -> None:
        self.synthesis = synthesis
        self.resumer = synthesis.resumer

    async def ListVoices(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListVoicesResponse:
        try:
            _parse(tts_pb2.ListVoicesRequest, data, "request")
        except InvalidRequestError as exc:
            await abort_with(context, exc)
        return tts_pb2.ListVoicesResponse(
            voices=[
                tts_pb2.VoiceInfo(name=p.name, description=p.description)
                for p in self.synthesis.voices.list()
            ]
        )

    async def Synthesize(self, data: bytes, context: grpc.aio.ServicerContext) -> None:
        async def parse(validator: Validator) -> tuple[str, StreamSettings]:
            request = _parse(tts_pb2.SynthesizeRequest, data, "request")
            return validator.text(request.text, "text"), validator.settings(request.config)

        await self._serve(context, "Synthesize", parse, _synthesize_reply, None)

    async def StreamingSynthesize(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        messages = _parsed(requests)
        gate = ReceiptGate()

        async def parse(validator: Validator) -> StreamSettings | _Resumable:
            try:
                first = await anext(messages)
            except StopAsyncIteration:
                raise ClientGoneError() from None  # half-closed before saying anything
            which = first.WhichOneof("request")
            if which == "resume":
                return _Resumable(None, first.resume)
            if which != "config":
                raise InvalidRequestError(
                    "config", "the first message of the stream must carry config (or resume)"
                )
            settings = validator.settings(first.config)
            gate.enabled = first.config.read_receipts
            resumable = first.config.resumable and self.resumer is not None
            return _Resumable(settings, None) if resumable else settings

        await self._serve(context, "StreamingSynthesize", parse, _streaming_reply, (messages, gate))

    async def _serve(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        parse: Callable[
            [Validator], Awaitable[tuple[str, StreamSettings] | StreamSettings | _Resumable]
        ],
        to_reply: Callable[[SessionEvent], Message],
        requests: tuple[AsyncIterator[tts_pb2.StreamingSynthesizeRequest], ReceiptGate] | None,
    ) -> None:
        """The way in, then one text or the stream of text messages (with the call's read
        receipts); our failures end the call with their status."""
        synthesis = self.synthesis
        timing = {"deadline": _deadline(context), "queue_timeout_s": context.time_remaining()}
        try:
            parsed = await synthesis.accept(
                method, authorization_of(context.invocation_metadata()), parse
            )
            if requests is None:
                assert isinstance(parsed, tuple)
                send = _writer(context, to_reply)
                await synthesis.synthesize(method, *parsed, send, **timing)
            elif isinstance(parsed, _Resumable):
                await self._resumable(context, parsed, *requests, timing)
            else:
                assert isinstance(parsed, StreamSettings)
                messages, gate = requests
                send = _writer(context, to_reply, gate=gate)
                await synthesis.stream(method, _fragments(messages, gate), parsed, send, **timing)
                await gate.settled()
        except ClientGoneError:
            return
        except Exception as exc:
            if not is_ours(exc):
                raise
            await self._abort(context, exc)

    async def _resumable(
        self,
        context: grpc.aio.ServicerContext,
        parsed: _Resumable,
        messages: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        gate: ReceiptGate,
        timing: dict[str, float | None],
    ) -> None:
        """A resumable stream begun, or resumed (`ResumeStream`), then this call attached to it
        until it ends or the connection drops (api/resume.py). Whether the client sends read
        receipts is the stream's, from its first call's config."""
        if self.resumer is None:
            raise ResumeError(
                "FAILED_PRECONDITION", "this server does not resume streams (--resume-window-s 0)"
            )
        authorization = authorization_of(context.invocation_metadata())
        start = heard = 0
        if parsed.resume is not None:
            resume = parsed.resume
            try:
                stream, start, heard = self.resumer.resume(
                    resume.stream_id,
                    resume.resume_token,
                    authorization,
                    resume.sample_offset,
                    resume.events_received,
                )
            except Exception as exc:
                self.synthesis.refused("StreamingSynthesize", exc)
                raise
            # At once: the client waits for them to know that it resumed.
            await context.send_initial_metadata(self.resumer.headers(stream))
            gate.enabled, gate.received = stream.read_receipts, resume.sample_offset
        else:
            assert parsed.settings is not None
            stream = self.resumer.open(authorization)
            stream.read_receipts = gate.enabled
            stream.start(
                self.synthesis.stream(
                    "StreamingSynthesize",
                    stream.fragments(),
                    parsed.settings,
                    stream.send,
                    guard_stalls=False,
                    deadline=timing["deadline"],
                    queue_timeout_s=timing["queue_timeout_s"],
                )
            )

        def headers() -> Sequence[tuple[str, str]]:  # with the first event, as for any stream
            assert self.resumer is not None
            stream.known_to_client = True
            return self.resumer.headers(stream)

        write = _writer(
            context, _streaming_reply, headers, started=parsed.resume is not None, gate=gate
        )
        reading = asyncio.create_task(_post_text(messages, stream, gate))
        try:
            await stream.attach(write, start, heard)
            await gate.settled(text_ended=stream.text_ended)
        finally:
            reading.cancel()

    async def _abort(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        ending = abort_with(context, exc, self.synthesis.retry_pushback_ms)
        if not isinstance(exc, ClientStalledError):
            await ending
            return
        try:
            async with asyncio.timeout(_STALLED_STATUS_WAIT_S):
                await ending
        except (TimeoutError, ExecuteBatchError):
            # Cancelled, the handler ends without sending its own status: grpcio logs nothing
            # and the queued DEADLINE_EXCEEDED stays the call's status. (On a loaded machine
            # the core can refuse the status batch outright while the unread write is still
            # in it: ExecuteBatchError, which grpcio would log as an ERROR.)
            raise asyncio.CancelledError() from None


def _writer(
    context: grpc.aio.ServicerContext,
    to_reply: Callable[[SessionEvent], Message],
    headers: Callable[[], Sequence[tuple[str, str]]] = lambda: (),
    started: bool = False,
    gate: ReceiptGate | None = None,
) -> Send:
    """Each event as a reply (once the client's receipts leave room for it), the initial
    metadata (`headers()`) with the first unless it was `started` already."""

    async def send(event: SessionEvent) -> None:
        nonlocal started
        if gate is not None:
            await gate.room_for(event)
        if not started:
            # The initial metadata in a batch of its own: a status can then be sent while a
            # write waits on a client that reads nothing (with the metadata inside that
            # write, grpcio refuses it: GRPC_CALL_ERROR_TOO_MANY_OPERATIONS).
            await context.send_initial_metadata(headers())
            started = True
        await context.write(to_reply(event))

    return send


@dataclass(frozen=True)
class _Resumable:
    """StreamingSynthesize's first message asked for a resumable stream, or to resume one."""

    settings: StreamSettings | None
    resume: tts_pb2.ResumeStream | None


async def _post_text(
    requests: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
    stream: ResumableStream,
    gate: ReceiptGate,
) -> None:
    """A resumable stream's call: each text message posted to the stream with its seq, its
    `last` ending the stream's input; `cancel` ends the stream; receipts go to the call's
    `gate`. The end of the requests ends nothing: a connection that drops looks the same here
    as a half-close."""
    try:
        async for message in requests:
            which = message.WhichOneof("request")
            if which == "cancel":
                stream.cancel()
                return
            if which == "receipt":
                gate.receipt(message.receipt.sample_offset)
                continue
            stream.post(message.text.seq, _fragment(message), message.text.last)
    except InvalidRequestError as exc:
        stream.end_input(exc)
    finally:
        gate.requests_ended()


def _parse(message_type: type[_M], data: bytes, field_name: str) -> _M:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise InvalidRequestError(
            field_name, f"is not a valid {message_type.DESCRIPTOR.name}: {str(exc)[-80:]}"
        ) from None


async def _parsed(
    request_iterator: AsyncIterator[bytes],
) -> AsyncIterator[tts_pb2.StreamingSynthesizeRequest]:
    async for data in request_iterator:
        yield _parse(tts_pb2.StreamingSynthesizeRequest, data, "request")


async def _fragments(
    requests: AsyncIterator[tts_pb2.StreamingSynthesizeRequest], gate: ReceiptGate
) -> AsyncIterator[TextFragment]:
    """The text messages after the config, as transport-neutral fragments; receipts go to
    `gate`."""
    try:
        async for message in requests:
            if message.WhichOneof("request") == "receipt":
                gate.receipt(message.receipt.sample_offset)
            else:
                yield _fragment(message)
    finally:
        gate.requests_ended()


def _fragment(message: tts_pb2.StreamingSynthesizeRequest) -> TextFragment:
    """A text message after the first, as a transport-neutral fragment."""
    which = message.WhichOneof("request")
    if which == "config":
        raise InvalidRequestError("config", "config may be sent only once, as the first message")
    if which == "resume":
        raise InvalidRequestError("resume", "resume may be sent only as the first message")
    if which == "cancel":
        raise ResumeError("CANCELLED", "the client ended the stream (CancelStream)")
    if which != "text":
        raise InvalidRequestError("text", "every message after the config must carry text")
    text = message.text
    return TextFragment(
        text.text,
        text.flush,
        text.clear,
        text.mark,
        segment=text.segment,
        replace=text.replace,
        if_started=IfStarted.from_pb(text.if_started),
        expires_in_ms=text.expires_in_ms,
    )


def add_to_server(servicer: TextToSpeechServicer, server: grpc.aio.Server) -> None:
    """Register the servicer like the generated helper, with requests left as bytes."""
    handlers = {
        "StreamingSynthesize": grpc.stream_stream_rpc_method_handler(
            servicer.StreamingSynthesize,
            response_serializer=tts_pb2.StreamingSynthesizeResponse.SerializeToString,
        ),
        "Synthesize": grpc.unary_stream_rpc_method_handler(
            servicer.Synthesize, response_serializer=tts_pb2.SynthesizeResponse.SerializeToString
        ),
        "ListVoices": grpc.unary_unary_rpc_method_handler(
            servicer.ListVoices, response_serializer=tts_pb2.ListVoicesResponse.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def _synthesize_reply(event: SessionEvent) -> tts_pb2.SynthesizeResponse:
    return reply(tts_pb2.SynthesizeResponse, event)


def _streaming_reply(event: SessionEvent) -> tts_pb2.StreamingSynthesizeResponse:
    return reply(tts_pb2.StreamingSynthesizeResponse, event)
