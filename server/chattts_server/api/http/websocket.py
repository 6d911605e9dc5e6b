"""`/v1/audio/speech/stream`: StreamingSynthesize over a WebSocket, for browsers and agents.

Messages (text frames are JSON objects with a `type`; README "WebSocket" has examples):

client -> server
  {"type": "config", ...}   first, once: the fields of tts.proto's SynthesisConfig in their
                            JSON form (`voice`, `audio_format`, `prosody`, `sampling`,
                            `text_release`, ...); `voice` may also be a string as on the
                            speech route (preset, `seed:N`, OpenAI name), `audio_format` may
                            be a `response_format` string (`pcm`, `wav`, `opus`, `mp3`,
                            `flac`, `aac`) or tts.proto's object (default LINEAR16 24 kHz).
  {"type": "text", "text": "...", "flush": false, "clear": false}
                            a fragment of text (TextInput); `flush` speaks what is buffered,
                            `clear` is barge-in (drop the buffer, stop the utterance being
                            spoken, speak what follows).
  {"type": "flush"} / {"type": "clear"}   the same without text.
  {"type": "end"}           no more text: speak what is buffered, then the server closes.

server -> client
  binary frames             audio, in the configured encoding, in order.
  {"type": "utterance_end", "utterance_index", "text", "audio_duration_s",
   "time_to_first_audio_s", "generation_time_s", "num_tokens", "finish_reason"}
  {"type": "done", "num_utterances", "audio_duration_s", "num_tokens"}   then close 1000.
  {"type": "error", "error": {"message", "type", "param", "code"}}       then close with
                            1008 (auth), 1007 (bad message or field), 1013 (full, starting
                            or draining: retry later), 1011 (synthesis failed).

The text fragments feed the same text reader as gRPC (release policy, markdown, barge-in);
a client that goes away (even after `end`) cancels the stream's generation at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from starlette.websockets import WebSocket, WebSocketState

from ..convert import AudioOptions, FieldError, StreamSettings
from ..errors import is_ours
from ..events import AudioOut, UtteranceEnded
from ..synthesis import Synthesis
from ..text_reader import TextFragment
from .errors import HTTPFailure, http_failure
from .openai_fields import FORMAT_ENCODINGS, resolve_voice
from .speech import synthesis_config

log = logging.getLogger(__name__)

METHOD = "HTTPSpeechStream"
_CLOSE_CODES = {400: 1007, 401: 1008, 403: 1008, 429: 1013, 503: 1013}


class _Gone(Exception):
    """The client closed the socket."""


async def _receive_json(ws: WebSocket) -> dict[str, Any]:
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise _Gone()
    raw = message.get("text")
    if raw is None:
        raise FieldError("message", "must be a JSON text frame, not binary")
    try:
        value = json.loads(raw)
    except ValueError:
        raise FieldError("message", "is not valid JSON") from None
    if not isinstance(value, dict):
        raise FieldError("message", "must be a JSON object")
    return value


def _fragment(message: dict[str, Any]) -> TextFragment:
    kind = message.get("type")
    if kind == "config":
        raise FieldError("config", "config may be sent only once, as the first message")
    if kind in ("flush", "clear"):
        return TextFragment("", flush=kind == "flush", clear=kind == "clear")
    if kind != "text":
        raise FieldError("type", f"must be text, flush, clear or end, got {str(kind)[:20]!r}")
    text = message.get("text", "")
    if not isinstance(text, str):
        raise FieldError("text", "must be a string")
    flags = {}
    for name in ("flush", "clear"):
        value = message.get(name, False)
        if not isinstance(value, bool):
            raise FieldError(name, "must be true or false")
        flags[name] = value
    return TextFragment(text, **flags)


async def _fragments(
    ws: WebSocket, on_gone: Callable[[], None], watchers: list[asyncio.Future[None]]
) -> AsyncIterator[TextFragment]:
    """The text messages after the config, up to `end`; after it a watcher (put in
    `watchers`, cancelled by the caller) still reads, to notice the client going away."""
    try:
        while True:
            message = await _receive_json(ws)
            if message.get("type") == "end":
                break
            yield _fragment(message)
    except _Gone:
        on_gone()
        return
    watchers.append(asyncio.ensure_future(_watch_gone(ws, on_gone)))


async def _watch_gone(ws: WebSocket, on_gone: Callable[[], None]) -> None:
    try:
        while True:
            await _receive_json(ws)  # anything after `end` is ignored
    except _Gone:
        on_gone()
    except (FieldError, RuntimeError):  # RuntimeError: we closed the socket
        return


def _settings(message: dict[str, Any], synthesis: Synthesis) -> StreamSettings:
    """The config message as StreamSettings, through the same Validator as gRPC."""
    if message.get("type") != "config":
        raise FieldError("config", 'the first message must be {"type": "config", ...}')
    fields = {k: v for k, v in message.items() if k != "type"}
    voice = fields.get("voice")
    named_voice = isinstance(voice, str) or (isinstance(voice, dict) and set(voice) == {"id"})
    if named_voice:
        fields.pop("voice")
    encoding: str | None = None
    audio_format = fields.get("audio_format")
    if isinstance(audio_format, str):
        if audio_format not in FORMAT_ENCODINGS:
            raise FieldError(
                "config.audio_format",
                f"must be one of {', '.join(FORMAT_ENCODINGS)} or an AudioFormat object",
            )
        encoding = FORMAT_ENCODINGS[audio_format][0]
        fields.pop("audio_format")
    config = synthesis_config({"config": fields}, prefix="config")
    if named_voice:
        config.voice.CopyFrom(resolve_voice(voice, synthesis.voices, "config.voice"))
    validator = synthesis.validator
    settings = validator.settings(config, prefix="config")
    if encoding is not None:
        if encoding == "OGG_OPUS" and encoding not in validator.supported_encodings:
            raise FieldError("config.audio_format", "opus is not available here (no PyAV)")
        rate = settings.audio.sample_rate_hz or validator.model.sample_rate
        settings = replace(settings, audio=AudioOptions(encoding=encoding, sample_rate_hz=rate))
    return settings


async def _send_error(ws: WebSocket, failed: HTTPFailure) -> None:
    if ws.application_state != WebSocketState.CONNECTED:
        return
    try:
        await ws.send_text(json.dumps({"type": "error", **failed.body}))
        await ws.close(_CLOSE_CODES.get(failed.status_code, 1011), failed.message[:120])
    except Exception:  # noqa: BLE001 - the client is gone already
        pass


async def speech_stream(
    ws: WebSocket, synthesis: Synthesis, auth_failure: HTTPFailure | None
) -> None:
    """Serve one WebSocket stream (the route calls this after its auth check)."""
    await ws.accept()
    retry_ms = synthesis.admission_config.retry_pushback_ms
    if auth_failure is not None:
        synthesis.refused(METHOD, auth_failure.status)
        await _send_error(ws, auth_failure)
        return
    try:
        synthesis.check_accepting()
        settings = _settings(await _receive_json(ws), synthesis)
    except _Gone:
        return
    except Exception as exc:
        if not is_ours(exc):
            raise
        synthesis.refused(METHOD, exc)
        await _send_error(ws, http_failure(exc, retry_ms))
        return

    gone = False
    speaker: asyncio.Future[None] | None = None
    closing: list[bool] = []  # set by _speak once it is closing the socket itself

    def on_gone() -> None:
        nonlocal gone
        if closing:
            return  # our own close, not the client leaving
        gone = True
        if speaker is not None:
            speaker.cancel()

    watchers: list[asyncio.Future[None]] = []
    speaker = asyncio.ensure_future(
        _speak(
            ws, synthesis, settings, _fragments(ws, on_gone, watchers), on_gone, retry_ms, closing
        )
    )
    try:
        await asyncio.wait({speaker})
    finally:
        for task in (speaker, *watchers):
            task.cancel()
        await asyncio.gather(speaker, *watchers, return_exceptions=True)
    if speaker.cancelled():
        if gone:
            log.info("WebSocket client went away; its generation was cancelled")
        return
    if speaker.exception() is not None:
        raise speaker.exception()  # type: ignore[misc]


async def _speak(
    ws: WebSocket,
    synthesis: Synthesis,
    settings: StreamSettings,
    fragments: AsyncIterator[TextFragment],
    on_gone: Callable[[], None],
    retry_ms: int,
    closing: list[bool],
) -> None:
    num_utterances, audio_s, num_tokens = 0, 0.0, 0

    async def send(data: bytes | str) -> None:
        try:
            if isinstance(data, bytes):
                await ws.send_bytes(data)
            else:
                await ws.send_text(data)
        except Exception:  # noqa: BLE001 - any failure to send means the client is gone
            on_gone()  # cancels this task: the stream ends CANCELLED, as on a read
            raise asyncio.CancelledError() from None

    try:
        async with aclosing(synthesis.stream(METHOD, fragments, settings)) as events:
            async for event in events:
                if isinstance(event, AudioOut):
                    await send(event.data)
                    continue
                num_utterances += 1
                audio_s += event.audio_duration_s
                num_tokens += event.done.num_tokens
                await send(json.dumps(_utterance_end(event)))
    except Exception as exc:
        if not is_ours(exc):
            raise
        closing.append(True)
        await _send_error(ws, http_failure(exc, retry_ms))
        return
    done = {
        "type": "done",
        "num_utterances": num_utterances,
        "audio_duration_s": audio_s,
        "num_tokens": num_tokens,
    }
    await send(json.dumps(done))
    closing.append(True)
    await ws.close(1000)


def _utterance_end(event: UtteranceEnded) -> dict[str, Any]:
    done = event.done
    return {
        "type": "utterance_end",
        "utterance_index": event.utterance_index,
        "text": done.text,
        "audio_duration_s": event.audio_duration_s,
        "time_to_first_audio_s": done.time_to_first_audio_s,
        "generation_time_s": done.generation_time_s,
        "num_tokens": done.num_tokens,
        "finish_reason": done.finish_reason,
    }
