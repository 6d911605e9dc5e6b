"""`POST /v1/audio/speech`, OpenAI-compatible, over the shared synthesis path.

The body is OpenAI's (`model`, `input`, `voice`, `instructions`, `response_format`, `speed`,
`stream_format`) plus an optional `chattts` object: a tts.proto SynthesisConfig in its JSON
form (`{"sampling": {"seed": 7}, "prosody": {"refine_text": true}}`), validated by the same
Validator as gRPC, for what OpenAI has no parameter for. `instructions` is accepted and not
used: ChatTTS has no instruction-following style control (prosody goes through `chattts`).

The response waits for admission and the first audio chunk, so every failure before audio is
an ordinary HTTP error with an OpenAI error object; then it streams: `stream_format=audio`
sends the encoded bytes as chunks (chunked transfer encoding, no Content-Length), `sse` sends
`speech.audio.delta` events with base64 audio and one `speech.audio.done` with usage. A
failure after the first byte ends an `sse` stream with an `error` event and cuts an `audio`
body short (the client sees an incomplete chunked body). A client that goes away cancels its
generation at once: a task waits on the ASGI `receive` for `http.disconnect` beside the
response and cancels it, which cancels the engine request (its slot is free within one step).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import json_format
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from chattts_proto.chattts.v1 import tts_pb2

from ..convert import AudioOptions, FieldError, StreamSettings
from ..errors import is_ours
from ..events import AudioOut, SessionEvent, UtteranceEnded
from ..synthesis import Synthesis
from .errors import HTTPFailure, http_failure
from .openai_fields import FORMAT_ENCODINGS, check_speed, resolve_voice, speed_level

log = logging.getLogger(__name__)

METHOD = "HTTPSpeech"
"""The method label of these streams in metrics and the stream log line."""
MAX_INSTRUCTIONS_CHARS = 4096
_STREAM_FORMATS = ("audio", "sse")


@dataclass(frozen=True)
class SpeechJob:
    """A validated speech request."""

    text: str
    settings: StreamSettings
    response_format: str
    stream_format: str
    content_type: str


def _optional_str(body: dict[str, Any], name: str, default: str) -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise FieldError(name, "must be a string")
    return value


def _pyav_installed() -> bool:
    return importlib.util.find_spec("av") is not None


def synthesis_config(body: dict[str, Any], prefix: str = "chattts") -> tts_pb2.SynthesisConfig:
    """The `chattts` extension object as a SynthesisConfig (proto JSON form)."""
    config = tts_pb2.SynthesisConfig()
    extension = body.get(prefix)
    if extension is None:
        return config
    if not isinstance(extension, dict):
        raise FieldError(prefix, "must be a SynthesisConfig as a JSON object")
    try:
        json_format.ParseDict(extension, config)
    except json_format.ParseError as exc:
        raise FieldError(prefix, str(exc)[:300]) from None
    return config


def parse_speech_request(body: object, synthesis: Synthesis) -> SpeechJob:
    """Validate an OpenAI speech body; FieldError names the parameter."""
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object")
    validator = synthesis.validator
    if "input" not in body:
        raise FieldError("input", "is required")
    if not isinstance(body["input"], str):
        raise FieldError("input", "must be a string")
    text = validator.text(body["input"], "input")
    _optional_str(body, "model", "chattts")  # any model name is accepted
    instructions = _optional_str(body, "instructions", "")
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise FieldError("instructions", f"is over {MAX_INSTRUCTIONS_CHARS} characters")
    response_format = _optional_str(body, "response_format", "mp3")
    if response_format not in FORMAT_ENCODINGS:
        raise FieldError(
            "response_format",
            f"must be one of {', '.join(FORMAT_ENCODINGS)}, got {response_format[:20]!r}",
        )
    stream_format = _optional_str(body, "stream_format", "audio")
    if stream_format not in _STREAM_FORMATS:
        raise FieldError("stream_format", f"must be audio or sse, got {stream_format[:20]!r}")
    speed = check_speed(body.get("speed", 1.0)) if body.get("speed") is not None else 1.0

    config = synthesis_config(body)
    if config.audio_format.encoding:
        raise FieldError("chattts.audio_format.encoding", "is set by response_format")
    if not config.HasField("voice") and body.get("voice") is not None:
        config.voice.CopyFrom(resolve_voice(body["voice"], synthesis.voices))
    if not config.prosody.HasField("speed"):
        config.prosody.speed = speed_level(speed)
    settings = validator.settings(config, prefix="chattts")

    encoding, content_type = FORMAT_ENCODINGS[response_format]
    if encoding == "OGG_OPUS" and encoding not in validator.supported_encodings:
        raise FieldError("response_format", "opus is not available on this server (no PyAV)")
    if encoding in ("MP3", "AAC", "FLAC") and not _pyav_installed():
        raise FieldError("response_format", f"{response_format} needs PyAV, not installed here")
    rate = settings.audio.sample_rate_hz or validator.model.sample_rate
    settings = replace(settings, audio=AudioOptions(encoding=encoding, sample_rate_hz=rate))
    return SpeechJob(
        text=text,
        settings=settings,
        response_format=response_format,
        stream_format=stream_format,
        content_type=content_type.format(rate=rate),
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
        self._ending = False
        """The last body message is being sent: a disconnect now is the normal end."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._respond(send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watcher):
                task.cancel()
            await asyncio.gather(work, watcher, return_exceptions=True)
        if not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
        if work.cancelled() and not self._ending:
            log.info("speech client went away; its generation was cancelled")

    async def _respond(self, send: Send) -> None:
        job = self.job
        events = self.synthesis.synthesize(METHOD, job.text, job.settings, text_field="input")
        sse = job.stream_format == "sse"
        output_tokens = 0
        async with aclosing(events):
            try:
                first: SessionEvent | None = await anext(events)
            except StopAsyncIteration:
                first = None
            except Exception as exc:
                if not is_ours(exc):
                    raise
                retry_ms = self.synthesis.admission_config.retry_pushback_ms
                await error_response(http_failure(exc, retry_ms))(
                    {"type": "http"}, _no_receive, send
                )
                return
            headers = [
                (b"content-type", (b"text/event-stream" if sse else job.content_type.encode())),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            try:
                pending = _chain(first, events)
                async for event in pending:
                    if isinstance(event, UtteranceEnded):
                        output_tokens += event.done.num_tokens
                        continue
                    assert isinstance(event, AudioOut)
                    await send(
                        {"type": "http.response.body", "body": _body(event, sse), "more_body": True}
                    )
            except Exception as exc:
                if not is_ours(exc):
                    raise
                failed = http_failure(exc)
                log.warning("speech stream failed after its first byte: %s", failed.message)
                if not sse:
                    return  # the body ends without its last chunk: the client sees it cut
                await send(
                    {
                        "type": "http.response.body",
                        "body": _sse({"type": "error", **failed.body}),
                        "more_body": False,
                    }
                )
                return
        tail = b""
        if sse:
            input_tokens = len(job.text)
            usage = {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            }
            tail = _sse({"type": "speech.audio.done", "usage": usage})
        self._ending = True
        await send({"type": "http.response.body", "body": tail, "more_body": False})


def _body(event: AudioOut, sse: bool) -> bytes:
    if not sse:
        return event.data
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(event.data).decode()})


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _chain(
    first: SessionEvent | None, rest: AsyncIterator[SessionEvent]
) -> AsyncIterator[SessionEvent]:
    if first is not None:
        yield first
    async for event in rest:
        yield event


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone away (the request body was read before)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _no_receive() -> Message:
    raise RuntimeError("the error response reads nothing")
