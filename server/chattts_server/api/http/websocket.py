"""`/v1/audio/speech/stream`: StreamingSynthesize over a WebSocket, for browsers and agents.

The messages each way are in ws_messages.py (and docs/api.md "WebSocket", with examples). A
socket's first message begins a stream (its config) or resumes one; then a speaker task writes
the stream's audio and messages out while the text messages come in.

A server whose model is still loading (--no-listen-when-ready) refuses the upgrade itself: HTTP
503 with the error object and Retry-After, so a proxy can send the upgrade to another replica.
A draining server serves an upgrade that still reaches it (on a connection opened before the
drain), as it serves streams queued before it.

A bad frame at any point (not JSON, nested too deep, a lone surrogate, an unknown type, a bad
field) ends the stream with its error and 1007: what was buffered is not spoken, and the
stream's log line and metrics say INVALID_ARGUMENT. The text fragments feed the same text
reader as gRPC (release policy, markdown, barge-in); a client that goes away (even after
`end`) cancels the stream's generation at once, unless the stream is resumable: then it is
held for a resume (api/resume.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketState

from ...errors import InvalidRequestError
from ...stream.events import AudioOut, SessionEvent
from ...stream.reader import TextFragment
from ..admission import NOT_READY, AdmissionRejected
from ..client_json import check_json, load_json
from ..convert import Validator
from ..errors import ClientGoneError, ClientStalledError, ResumeError, is_ours
from ..events import to_json
from ..resume import STREAM_ID_HEADER, ResumableStream
from ..stream_record import StreamRecord
from ..synthesis import Synthesis
from .errors import HTTPFailure, http_failure
from .ws_contexts import ContextSocket
from .ws_messages import Begin, ResumeRequest, count, fragment, stream_message, ws_settings

log = logging.getLogger(__name__)

METHOD = "HTTPSpeechStream"
_CLOSE_CODES = {400: 1007, 401: 1008, 403: 1008, 404: 1008, 429: 1013, 499: 1000, 503: 1013}
_MESSAGE_TOO_BIG = 1009
_STALLED = 1008
_MAX_REASON_BYTES = 123  # a close frame's payload is 125 bytes, 2 of them the code


async def _receive_json(ws: WebSocket) -> dict[str, Any]:
    """The next message as a JSON object, checked (client_json); ClientGoneError once the
    client has closed, InvalidRequestError for a bad message."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        if message.get("code") == _MESSAGE_TOO_BIG:
            raise InvalidRequestError("message", "is over --max-ws-message-bytes (closed 1009)")
        raise ClientGoneError()
    raw = message.get("text")
    if raw is None:
        raise InvalidRequestError("message", "must be a JSON text frame, not binary")
    value = load_json(raw, "message")
    if not isinstance(value, dict):
        raise InvalidRequestError("message", "must be a JSON object")
    check_json(value, "message", "config." if value.get("type") == "config" else "")
    return value


async def speech_stream(ws: WebSocket, synthesis: Synthesis) -> None:
    """Serve one WebSocket stream: the way in, then the text in and the audio out."""
    if not synthesis.admission.ready:
        await _deny_upgrade(ws, synthesis)
        return
    resumer = synthesis.resumer
    stream_id = resumer.new_id() if resumer is not None else ""
    await ws.accept(
        headers=[(STREAM_ID_HEADER.encode(), stream_id.encode())] if stream_id else None
    )
    # Browsers cannot set headers on a WebSocket: they may pass ?api_key= instead.
    header = ws.headers.get("authorization")
    if header is None and "api_key" in ws.query_params:
        header = "Bearer " + ws.query_params["api_key"]

    async def parse(validator: Validator) -> Begin:
        message = await _receive_json(ws)
        if "context_id" in message:  # a context socket, on the server's defaults
            defaults = ws_settings({"type": "config"}, validator, synthesis.voices)
            return Begin(defaults, contexts=True, first=message, stream_id=stream_id)
        if message.get("type") == "resume":
            return Begin(None, ResumeRequest.parse(message), stream_id=stream_id)
        if message.get("contexts") is True and message.get("type") == "config":
            fields = {k: v for k, v in message.items() if k != "contexts"}
            settings = ws_settings(fields, validator, synthesis.voices)
            resumable = message.get("resumable") is True and resumer is not None
            return Begin(settings, resumable=resumable, stream_id=stream_id, contexts=True)
        settings = ws_settings(message, validator, synthesis.voices)
        resumable = message.get("resumable") is True and resumer is not None
        return Begin(settings, resumable=resumable, stream_id=stream_id)

    try:
        begin = await synthesis.accept(METHOD, header, parse)
    except ClientGoneError:
        return
    except Exception as exc:
        if not is_ours(exc):
            raise
        await _end_with_error(ws, synthesis, exc)
        return

    if begin.contexts:
        assert begin.settings is not None
        contexts = ContextSocket(ws, synthesis, METHOD, begin, header)
        await contexts.run(_receive_json)
        return
    await _Conversation(ws, synthesis, begin, header).run()


class _State(enum.Enum):
    OPEN = "open"
    """Text in, audio out."""
    CLOSING = "closing"
    """We are ending the stream (done or an error): a read failing now is our own close."""
    CLIENT_GONE = "client gone"
    """The client left first: the stream's generation is cancelled."""


class _Conversation:
    """One WebSocket stream after its config: a speaker task that reads the text messages and
    writes the audio, and, after `end`, a watcher that still reads to notice the client going
    away. Either one that sees the client gone moves the state to CLIENT_GONE, which cancels
    the speaker. A resumable stream runs apart from the socket (api/resume.py): the speaker
    writes its log out, and a reader task posts the text messages to it."""

    def __init__(
        self, ws: WebSocket, synthesis: Synthesis, begin: Begin, authorization: str | None
    ) -> None:
        self.ws, self.synthesis, self.begin = ws, synthesis, begin
        self.authorization = authorization
        self.state = _State.OPEN
        self._speaker: asyncio.Future[None] | None = None
        self._watcher: asyncio.Future[None] | None = None

    async def run(self) -> None:
        with self.synthesis.socket_stream():
            await self._run()

    async def _run(self) -> None:
        self._speaker = speaker = asyncio.ensure_future(self._speak())
        try:
            await asyncio.wait({speaker})
        finally:
            tasks = [t for t in (speaker, self._watcher) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if speaker.cancelled():
            if self.state is _State.CLIENT_GONE:
                resumable = self.begin.resumable or self.begin.resume is not None
                held = "held for a resume" if resumable else "cancelled"
                log.info("WebSocket client went away; its stream was %s", held)
            return
        if speaker.exception() is not None:
            raise speaker.exception()  # type: ignore[misc]

    def _client_gone(self) -> None:
        if self.state is not _State.OPEN:
            return  # our own close, or noticed already
        self.state = _State.CLIENT_GONE
        if self._speaker is not None:
            self._speaker.cancel()

    async def _fragments(self) -> AsyncIterator[TextFragment]:
        """The text messages after the config, up to `end`; then the watcher takes over."""
        try:
            while True:
                message = await _receive_json(self.ws)
                if message.get("type") == "end":
                    break
                yield fragment(message)
        except ClientGoneError:
            self._client_gone()
            return
        self._watcher = asyncio.ensure_future(self._watch_gone())

    async def _watch_gone(self) -> None:
        while True:
            try:
                await _receive_json(self.ws)  # anything after `end` is ignored
            except ClientGoneError:
                self._client_gone()
                return
            except InvalidRequestError:
                if self.ws.client_state == WebSocketState.DISCONNECTED:  # closed 1009
                    self._client_gone()
                    return
            except RuntimeError:  # we closed the socket (starlette's WebSocketDisconnected)
                return

    async def _write(self, data: bytes | str) -> None:
        try:
            if isinstance(data, bytes):
                await self.ws.send_bytes(data)
            else:
                await self.ws.send_text(data)
        except Exception:  # noqa: BLE001 - any failure to send means the client is gone
            self._client_gone()  # cancels this task: the stream ends CANCELLED, as on a read
            raise asyncio.CancelledError() from None

    async def _send(self, event: SessionEvent) -> None:
        if isinstance(event, AudioOut):
            await self._write(event.data)
        else:
            await self._write(json.dumps(to_json(event)))

    async def _speak(self) -> None:
        synthesis, begin = self.synthesis, self.begin
        try:
            if begin.settings is not None and not begin.resumable:
                record = await synthesis.stream(
                    METHOD, self._fragments(), begin.settings, self._send
                )
            else:
                record = await self._speak_resumable()
            done = {
                "type": "done",
                "num_utterances": record.num_utterances,
                "audio_duration_s": record.audio_s,
                "num_tokens": record.num_tokens,
            }
            await synthesis.deliver(self._write(json.dumps(done)))
        except Exception as exc:
            if not is_ours(exc):
                raise
            self.state = _State.CLOSING
            await _end_with_error(self.ws, synthesis, exc)
            return
        self.state = _State.CLOSING
        await _close(self.ws, synthesis, 1000, "")

    async def _speak_resumable(self) -> StreamRecord:
        """A resumable stream begun, or resumed, then this socket attached to it until it ends
        (its record) or the socket goes (the stream is parked)."""
        resumer, begin = self.synthesis.resumer, self.begin
        start = heard = 0
        if begin.resume is not None:
            r = begin.resume
            try:
                if resumer is None:
                    raise ResumeError(
                        "FAILED_PRECONDITION",
                        "this server does not resume streams (--resume-window-s 0)",
                    )
                stream, start, heard = resumer.resume(
                    r.stream_id, r.token, self.authorization, r.sample_offset, r.events_received
                )
            except Exception as exc:
                self.synthesis.refused(METHOD, exc)
                raise
            await self._write(stream_message("resumed", resumer, stream))
        else:
            # `resumable` only where the server resumes (speech_stream's parse).
            assert begin.settings is not None and resumer is not None
            stream = resumer.open(self.authorization, begin.stream_id)
            try:
                await self._write(stream_message("stream", resumer, stream))
            except BaseException:
                resumer.forget(stream)  # never begun: none could resume it
                raise
            stream.known_to_client = True
            run = self.synthesis.stream(
                METHOD, stream.fragments(), begin.settings, stream.send, guard_stalls=False
            )
            stream.start(run)
        self._watcher = asyncio.ensure_future(self._post_text(stream))
        await stream.attach(self._send, start, heard)
        assert stream.task is not None
        record: StreamRecord = stream.task.result()
        return record

    async def _post_text(self, stream: ResumableStream) -> None:
        """A resumable stream's text messages posted to it, each `seq` applied once; `end` ends
        its text (then the socket is only watched), `cancel` the stream."""
        try:
            while True:
                message = await _receive_json(self.ws)
                kind = message.get("type")
                if kind == "end":
                    stream.end_input()
                    break
                if kind == "cancel":
                    stream.cancel()
                    return
                stream.post(count(message, "seq"), fragment(message))
        except ClientGoneError:
            self._client_gone()
            return
        except InvalidRequestError as exc:
            stream.end_input(exc)
            return
        except RuntimeError:  # we closed the socket
            return
        await self._watch_gone()


async def _end_with_error(ws: WebSocket, synthesis: Synthesis, exc: BaseException) -> None:
    """The error message, then the close code for it; a stalled client gets only the close
    (1008 with the reason), since it reads nothing. Every write is under the stall timeout."""
    failed: HTTPFailure = http_failure(exc, synthesis.retry_pushback_ms)
    if isinstance(exc, ClientStalledError):
        await _close(ws, synthesis, _STALLED, failed.message)
        return
    if _gone(ws):
        return
    try:
        await synthesis.deliver(ws.send_text(json.dumps({"type": "error", **failed.body})))
    except ClientStalledError:
        pass
    except Exception:  # noqa: BLE001 - the client is gone already
        return
    await _close(ws, synthesis, _CLOSE_CODES.get(failed.status_code, 1011), failed.message)


async def _deny_upgrade(ws: WebSocket, synthesis: Synthesis) -> None:
    """Not ready (--no-listen-when-ready while loading): HTTP 503 in place of the upgrade, so
    a proxy resends the upgrade to another replica (HAProxy's `retry-on 503`). After the upgrade
    only a 1013 close could say so, which no proxy retries. (A draining replica serves an
    upgrade that still reaches it, as `Admission.draining` says.)"""
    exc = AdmissionRejected("unavailable", NOT_READY)
    synthesis.refused(METHOD, exc)
    failed = http_failure(exc)
    headers = {**failed.headers, "Retry-After": "1"}
    await ws.send_denial_response(JSONResponse(failed.body, failed.status_code, headers))


async def _close(ws: WebSocket, synthesis: Synthesis, code: int, reason: str) -> None:
    if _gone(ws):
        return
    reason = reason.encode()[:_MAX_REASON_BYTES].decode(errors="ignore")
    # The close frame waits behind unread audio: given up after the stall timeout (the slot
    # is free already), and uvicorn closes the connection when we return.
    with contextlib.suppress(Exception):  # gone, or still not reading
        await synthesis.deliver(ws.close(code, reason))


def _gone(ws: WebSocket) -> bool:
    return (
        ws.application_state != WebSocketState.CONNECTED
        or ws.client_state == WebSocketState.DISCONNECTED
    )
