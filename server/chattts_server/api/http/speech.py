"""`POST /v1/audio/speech`, OpenAI-compatible, over the one way in (api/synthesis.py).

The body is OpenAI's (`model`, `input`, `voice`, `instructions`, `response_format`, `speed`,
`stream_format`) plus an optional `chattts` object: a tts.proto SynthesisConfig in its JSON
form (`{"sampling": {"seed": 7}, "prosody": {"refine_text": true}}`), validated by the same
Validator as gRPC, for what OpenAI has no parameter for. `instructions` is accepted and not
used: ChatTTS has no instruction-following style control (prosody goes through `chattts`).

The body is read within `--max-body-bytes` (413 from Content-Length before reading it, or
while reading a chunked one) and parsed within bounds (client_json.py). The response waits
for admission and the first audio chunk, so every failure before audio is an ordinary HTTP
error with an OpenAI error object; then it streams: `stream_format=audio` sends the encoded
bytes as chunks (chunked transfer encoding, no Content-Length), `sse` sends
`speech.audio.delta` events with base64 audio and one `speech.audio.done` with usage, and, as a
documented extension, `speech.word_timings` events (with `"chattts": {"word_timing": true}`:
each utterance's words, after its audio deltas; the WebSocket's `word_timings` message). A
failure after the first byte ends an `sse` stream with an `error` event and cuts an `audio`
body short (the connection is dropped: the client sees an incomplete chunked body); a stalled
reader's body is cut the same way. A client that goes away cancels its generation at once: a
task waits on the ASGI `receive` for `http.disconnect` beside the response and cancels it,
which cancels the engine request (its slot is free within one step).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ...errors import InvalidRequestError
from ...stream.events import AudioOut, MarkReached, SessionEvent
from ...stream.settings import StreamSettings
from ...timing.timeline import WordTimingsOut
from ..client_json import parse_json
from ..convert import Validator
from ..errors import ClientGoneError, ClientStalledError, is_ours
from ..events import to_json
from ..synthesis import Synthesis
from ..voices import VoiceLibrary
from .errors import HTTPFailure, PayloadTooLargeError, http_failure
from .openai_fields import check_speed, content_type, openai_settings, synthesis_config
from .protocol import ABORT_EXTENSION

log = logging.getLogger(__name__)

METHOD = "HTTPSpeech"
"""The method label of these streams in metrics and the stream log line."""
MAX_INSTRUCTIONS_CHARS = 4096
_STREAM_FORMATS = ("audio", "sse")
_CUT_WAIT_S = 1.0
"""After dropping the connection, how long to wait for uvicorn to see it gone."""


@dataclass(frozen=True)
class SpeechJob:
    """A validated speech request."""

    text: str
    settings: StreamSettings
    response_format: str
    stream_format: str
    content_type: str


async def speech_route(request: Request, synthesis: Synthesis, max_body_bytes: int) -> Response:
    """The route: the way in (token, accepting, body, settings), then the streamed answer."""

    async def parse(validator: Validator) -> SpeechJob:
        body = parse_json(await read_body(request, max_body_bytes), "body")
        return parse_speech_request(body, validator, synthesis.voices)

    try:
        job = await synthesis.accept(METHOD, request.headers.get("authorization"), parse)
    except ClientGoneError:
        log.info("speech client went away before its request was read")
        return Response(status_code=400)  # nobody is there to read it
    except Exception as exc:
        if not is_ours(exc):
            raise
        return error_response(http_failure(exc, synthesis.retry_pushback_ms))
    return SpeechResponse(synthesis, job)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, at most `max_bytes` (PayloadTooLargeError before reading when
    Content-Length says more); ClientGoneError if the client leaves mid-upload."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError("body", f"is {declared} bytes; the limit is {max_bytes}")
    parts, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLargeError("body", f"is over the limit of {max_bytes} bytes")
            parts.append(chunk)
    except ClientDisconnect:
        raise ClientGoneError() from None
    return b"".join(parts)


def _optional_str(body: dict[str, Any], name: str, default: str) -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRequestError(name, "must be a string")
    return value


def parse_speech_request(body: object, validator: Validator, voices: VoiceLibrary) -> SpeechJob:
    """Validate an OpenAI speech body; InvalidRequestError names the parameter."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    if "input" not in body:
        raise InvalidRequestError("input", "is required")
    if not isinstance(body["input"], str):
        raise InvalidRequestError("input", "must be a string")
    text = validator.text(body["input"], "input")
    _optional_str(body, "model", "chattts")  # any model name is accepted
    instructions = _optional_str(body, "instructions", "")
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise InvalidRequestError("instructions", f"is over {MAX_INSTRUCTIONS_CHARS} characters")
    response_format = _optional_str(body, "response_format", "mp3")
    stream_format = _optional_str(body, "stream_format", "audio")
    if stream_format not in _STREAM_FORMATS:
        raise InvalidRequestError(
            "stream_format", f"must be audio or sse, got {stream_format[:20]!r}"
        )
    speed = check_speed(body["speed"]) if body.get("speed") is not None else None
    config = synthesis_config(body.get("chattts"), "chattts")
    if config.audio_format.encoding:
        raise InvalidRequestError("chattts.audio_format.encoding", "is set by response_format")
    settings = openai_settings(
        validator,
        voices,
        config,
        "chattts",
        voice=body.get("voice"),
        speed=speed,
        response_format=response_format,
    )
    return SpeechJob(
        text=text,
        settings=settings,
        response_format=response_format,
        stream_format=stream_format,
        content_type=content_type(response_format, settings.audio.sample_rate_hz),
    )


def error_response(failed: HTTPFailure) -> Response:
    return Response(
        json.dumps(failed.body),
        status_code=failed.status_code,
        headers=failed.headers,
        media_type="application/json",
    )


class SpeechResponse(Response):
    """Streams one speech request; cancels it when the client disconnects."""

    def __init__(self, synthesis: Synthesis, job: SpeechJob) -> None:
        super().__init__(status_code=200)
        self.synthesis = synthesis
        self.job = job
        self._started = False
        """The response head is sent: a failure now can only cut the body."""
        self._ending = False
        """The last body message is being sent: a disconnect now is the normal end."""
        self._dropped = False
        """The connection was dropped on purpose (the body cut)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._respond(scope, send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if self._dropped and not watcher.done():
                # uvicorn must see the connection gone before we return, or it logs the body
                # as unfinished.
                await asyncio.wait({watcher}, timeout=_CUT_WAIT_S)
        finally:
            for task in (work, watcher):
                task.cancel()
            await asyncio.gather(work, watcher, return_exceptions=True)
        if not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
        if work.cancelled() and not self._ending:
            log.info("speech client went away; its generation was cancelled")

    async def _respond(self, scope: Scope, send: Send) -> None:
        job, synthesis = self.job, self.synthesis
        sse = job.stream_format == "sse"

        async def start() -> None:
            if not self._started:
                self._started = True
                kind = b"text/event-stream" if sse else job.content_type.encode()
                headers = [
                    (b"content-type", kind),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def send_event(event: SessionEvent) -> None:
            body = _body(event, sse)
            if body is not None:
                await start()
                await send({"type": "http.response.body", "body": body, "more_body": True})

        try:
            record = await synthesis.synthesize(
                METHOD, job.text, job.settings, send_event, text_field="input"
            )
            await synthesis.deliver(start())
            tail = b""
            if sse:
                input_tokens = len(job.text)
                usage = {
                    "input_tokens": input_tokens,
                    "output_tokens": record.num_tokens,
                    "total_tokens": input_tokens + record.num_tokens,
                }
                tail = _sse({"type": "speech.audio.done", "usage": usage})
            self._ending = True
            await synthesis.deliver(
                send({"type": "http.response.body", "body": tail, "more_body": False})
            )
        except Exception as exc:
            if not is_ours(exc):
                raise
            await self._failed(exc, scope, send, sse)

    async def _failed(self, exc: BaseException, scope: Scope, send: Send, sse: bool) -> None:
        failed = http_failure(exc, self.synthesis.retry_pushback_ms)
        if not self._started:
            await error_response(failed)({"type": "http"}, _no_receive, send)
            return
        if not isinstance(exc, ClientStalledError):
            log.warning("speech stream failed after its first byte: %s", failed.message)
            if sse:
                event = _sse({"type": "error", **failed.body})
                try:
                    await self.synthesis.deliver(
                        send({"type": "http.response.body", "body": event, "more_body": False})
                    )
                    return
                except ClientStalledError:
                    pass
        self._cut(scope)

    def _cut(self, scope: Scope) -> None:
        """End the body short: drop the connection (without our server's extension, return
        with the body unfinished, which the server cuts)."""
        abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
        if abort is not None:
            abort()
            self._dropped = True


def _body(event: SessionEvent, sse: bool) -> bytes | None:
    """What an event adds to the body: audio (as is, or a delta event), and over SSE the
    timeline's extension events; None for what the body does not carry."""
    if isinstance(event, AudioOut):
        if not sse:
            return event.data
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(event.data).decode()})
    if sse and isinstance(event, WordTimingsOut | MarkReached):
        return _sse({**to_json(event), "type": SSE_EXTENSION_EVENTS[type(event)]})
    return None


SSE_EXTENSION_EVENTS: dict[type, str] = {
    WordTimingsOut: "speech.word_timings",
    MarkReached: "speech.mark",
}
"""Our SSE events beside OpenAI's (`speech.audio.delta`, `speech.audio.done`): the WebSocket's
`word_timings` and `mark` messages under these types (word timings when
`chattts.word_timing` is true; marks come from SSML only)."""


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone away (the request body was read before)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _no_receive() -> Message:
    raise RuntimeError("the error response reads nothing")
