"""Many streams on one WebSocket: contexts, for voice agents that keep one socket for a session
and open a context per turn (ElevenLabs' multi-stream input, Cartesia's and KugelAudio's
contexts). A socket whose first message names a `context_id`, or is a config with
`"contexts": true`, is a context socket; one that never does is served as before (websocket.py).

On a context socket every message names its `context_id` (a string of 1 to 64 UTF-8 bytes,
printable). A context opens with its first `config` (any field of a stream's config; without
one, on its first `text`, it takes the socket's config) and is a stream of its own: admitted,
limited and prioritised as one, with its own timeline (sample offsets, marks, word timing and
utterance ends count its own audio only). Text, flush, clear, mark, segment and replace work
per context; `{"type": "close_context", "context_id", "immediate": false}` finishes what was
sent (`true`: stops now, barge-in). Every JSON message the server sends for a context names it;
each audio frame starts with a header naming it (`audio_frame`). A context's last message is
`{"type": "context_closed", "context_id", "reason", "num_utterances", "audio_duration_s",
"num_tokens"}`, reason `closed`, `immediate`, `idle` (no message for --ws-context-idle-s: what
was sent is finished) or `error` (after its error message). An error in one context (a bad
config, a context over --ws-max-contexts, a full server, a message for a context not open) is an
error message naming it; the socket and the other contexts go on. `{"type": "end"}` (no
context) finishes every context, then the server closes 1000.

A context whose config says `"resumable": true` (or the socket's config, for a context opened
without one) outlives the socket as a resumable stream does (api/resume.py): its first message
is `{"type": "stream", "context_id", "stream_id", "resume_token", "resume_window_s",
"text_seq"}`, its text messages may carry `seq`, and when the socket drops it is held for the
resume window. On a new context socket, `{"type": "resume", "context_id", "stream_id",
"resume_token", "sample_offset", "events_received"}` attaches it again (`resumed`, then its
audio from that sample on and every later message once). The first resumable context of a
socket takes the stream id its upgrade response named, which a proxy sticks on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket

from ...errors import InvalidRequestError
from ...stream.events import AudioOut, SessionEvent
from ...stream.reader import TextFragment
from ...stream.settings import StreamSettings
from ..admission import AdmissionRejected
from ..errors import ClientGoneError, ClientStalledError, ResumeError, is_ours
from ..events import to_json
from ..resume import ResumableStream, Write
from ..stream_record import StreamRecord
from ..synthesis import Synthesis
from .errors import http_failure
from .ws_messages import (
    Begin,
    ResumeRequest,
    audio_frame,
    context_id_of,
    count,
    fragment,
    stream_message,
    ws_settings,
)

log = logging.getLogger(__name__)

_END = object()
_IDLE_CHECK_S = 0.5


@dataclass(eq=False)
class _Context:
    context_id: str
    settings: StreamSettings | None
    """None for a context resumed: its stream has its settings."""
    last_message: float
    text: asyncio.Queue[TextFragment | object] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    reason: str = ""
    """Why it is closing: closed, immediate or idle ("" while open)."""
    stream: ResumableStream | None = None
    """A resumable context's stream (api/resume.py), which outlives the socket."""
    resumed_at: tuple[int, int] | None = None
    """A resumed context: the log entry to write first and the samples of it already heard."""

    async def fragments(self) -> AsyncIterator[TextFragment]:
        while (item := await self.text.get()) is not _END:
            assert isinstance(item, TextFragment)
            yield item

    def post(self, message: dict[str, Any]) -> None:
        """A text, replace, flush, clear or mark message (each `seq` once, when resumable)."""
        if self.stream is not None:
            self.stream.post(count(message, "seq"), fragment(message))
        else:
            self.text.put_nowait(fragment(message))

    def finish(self, reason: str) -> None:
        """No more text: speak what was sent, then close."""
        if not self.reason:
            self.reason = reason
            if self.stream is not None:
                self.stream.end_input()
            else:
                self.text.put_nowait(_END)

    def stop(self) -> None:
        """Stop now (close_context `immediate`: barge-in). The task's cancel waits one loop turn:
        a task cancelled before its first step would never run, nor say that it closed (a
        config and an immediate close can arrive together)."""
        self.reason = "immediate"
        if self.stream is not None:
            self.stream.cancel()  # one not yet begun is not begun (`_attached`)
        elif self.task is not None:
            asyncio.get_running_loop().call_soon(self.task.cancel)


class ContextSocket:
    """One context socket after its first message: a reader that routes each message to its
    context, a task per context, and one writer lock for the socket's frames."""

    def __init__(
        self,
        ws: WebSocket,
        synthesis: Synthesis,
        method: str,
        begin: Begin,
        authorization: str | None,
    ) -> None:
        self.ws, self.synthesis, self.method = ws, synthesis, method
        assert begin.settings is not None
        self.defaults = begin.settings
        """The socket's config: a context opened without one of its own takes it."""
        self.resumable = begin.resumable
        """The socket's config asked for resumable contexts."""
        self.first = begin.first
        self.authorization = authorization
        self.upgrade_stream_id = begin.stream_id
        """The id the upgrade response named: the first resumable context's."""
        self.contexts: dict[str, _Context] = {}
        self._write_lock = asyncio.Lock()
        self._gone = False
        limits = synthesis.limits
        self.max_contexts, self.idle_s = limits.ws_max_contexts, limits.ws_context_idle_s

    async def run(self, receive: Any) -> None:
        """Serve until the client ends the socket (`end`, then every context finishes) or goes
        away (every context is cancelled). `receive` reads the next message as a JSON object."""
        loop = asyncio.get_running_loop()
        idle = loop.create_task(self._close_idle()) if self.idle_s else None
        try:
            if self.first is not None:
                await self._dispatch(self.first)
            while True:
                try:
                    message = await receive(self.ws)
                except InvalidRequestError as exc:
                    await self._error(None, exc)
                    continue
                if message.get("type") == "end" and "context_id" not in message:
                    break
                await self._dispatch(message)
                if self._gone:
                    return  # its contexts are cancelled below; uvicorn closes the connection
            with self.synthesis.socket_stream():  # its contexts' ends, then the close
                for context in list(self.contexts.values()):
                    context.finish("closed")
                tasks = [c.task for c in self.contexts.values() if c.task is not None]
                await asyncio.gather(*tasks, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await self.synthesis.deliver(self.ws.close(1000))
        except (ClientGoneError, RuntimeError):
            self._gone = True  # the client left (or we closed): its contexts end with it
        finally:
            if idle is not None:
                idle.cancel()
            for context in list(self.contexts.values()):
                if context.task is not None:
                    context.task.cancel()
            tasks = [c.task for c in self.contexts.values() if c.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        context_id: str | None = None
        try:
            context_id = context_id_of(message)
            kind = message.get("type")
            context = self.contexts.get(context_id)
            if context is not None:
                context.last_message = asyncio.get_running_loop().time()
            if kind in ("config", "resume") and context is not None:
                raise InvalidRequestError("context_id", f"is open already: no {kind} for it")
            if kind == "config":
                resumable = message.get("resumable", self.resumable) is True
                self._open(context_id, self._settings(message), resumable)
            elif kind == "resume":
                self._resume(context_id, ResumeRequest.parse(message))
            elif kind == "close_context":
                open_context = self._known(context_id, context)
                immediate = message.get("immediate", False)
                if not isinstance(immediate, bool):
                    raise InvalidRequestError("immediate", "must be true or false")
                if immediate:
                    open_context.stop()
                else:
                    open_context.finish("closed")
            elif context is None and kind == "text":
                self._open(context_id, self.defaults, self.resumable).post(message)
            else:
                self._known(context_id, context).post(message)
        except Exception as exc:
            if not is_ours(exc):
                raise
            await self._error(context_id, exc)

    def _known(self, context_id: str, context: _Context | None) -> _Context:
        if context is None or context.reason:
            raise InvalidRequestError("context_id", f"no context {context_id!r} is open")
        return context

    def _settings(self, message: dict[str, Any]) -> StreamSettings:
        fields = {k: v for k, v in message.items() if k not in ("context_id", "resumable")}
        try:
            return ws_settings(fields, self.synthesis.validator, self.synthesis.voices)
        except Exception as exc:
            if is_ours(exc):
                self.synthesis.refused(self.method, exc)
            raise

    def _open(self, context_id: str, settings: StreamSettings, resumable: bool) -> _Context:
        self._check_room()
        context = _Context(context_id, settings, asyncio.get_running_loop().time())
        resumer = self.synthesis.resumer
        if resumable and resumer is not None:
            stream_id, self.upgrade_stream_id = self.upgrade_stream_id or None, ""
            context.stream = resumer.open(self.authorization, stream_id)
        return self._started(context)

    def _resume(self, context_id: str, request: ResumeRequest) -> None:
        """A resumable context held since its socket dropped, attached to this one."""
        self._check_room()
        try:
            if self.synthesis.resumer is None:
                raise ResumeError(
                    "FAILED_PRECONDITION",
                    "this server does not resume streams (--resume-window-s 0)",
                )
            r = request
            stream, start, heard = self.synthesis.resumer.resume(
                r.stream_id, r.token, self.authorization, r.sample_offset, r.events_received
            )
        except Exception as exc:
            self.synthesis.refused(self.method, exc)
            raise
        context = _Context(context_id, None, asyncio.get_running_loop().time(), stream=stream)
        context.resumed_at = (start, heard)
        self._started(context)

    def _check_room(self) -> None:
        if len(self.contexts) >= self.max_contexts:
            exc = AdmissionRejected(
                "exhausted",
                f"this socket has {self.max_contexts} contexts open (--ws-max-contexts): close "
                "one first",
            )
            self.synthesis.refused(self.method, exc)
            raise exc

    def _started(self, context: _Context) -> _Context:
        self.contexts[context.context_id] = context
        context.task = asyncio.get_running_loop().create_task(self._speak(context))
        return context

    async def _speak(self, context: _Context) -> None:
        """The context's stream; then its last message."""
        with self.synthesis.socket_stream():
            await self._speak_context(context)

    async def _speak_context(self, context: _Context) -> None:
        cid = context.context_id

        async def send(event: SessionEvent) -> None:
            if isinstance(event, AudioOut):
                await self._write(audio_frame(cid, event.data))
            else:
                await self._write(json.dumps({**to_json(event), "context_id": cid}))

        record = None
        try:
            if context.stream is not None:
                record = await self._attached(context, send)
            else:
                assert context.settings is not None
                record = await self.synthesis.stream(
                    self.method, context.fragments(), context.settings, send
                )
        except asyncio.CancelledError:
            if context.reason != "immediate" or self._gone:
                raise  # the socket went: a resumable context's stream is held for a resume
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # the stop asked for: the context still says it closed
        except Exception as exc:
            if not is_ours(exc):
                raise
            if context.reason != "immediate":  # a resumable one's stop ends it CANCELLED
                context.reason = "error"
                await self._error(cid, exc)
        finally:
            if self.contexts.get(cid) is context:
                del self.contexts[cid]
        closed: dict[str, Any] = {"type": "context_closed", "context_id": cid}
        closed["reason"] = context.reason or "closed"
        if record is not None:
            closed |= {
                "num_utterances": record.num_utterances,
                "audio_duration_s": record.audio_s,
                "num_tokens": record.num_tokens,
            }
        await self._write(json.dumps(closed))

    async def _attached(self, context: _Context, send: Write) -> StreamRecord | None:
        """A resumable context's stream begun (its `stream` message) or resumed (`resumed`),
        then this socket attached to it until it ends: its record (None: stopped before it
        began)."""
        stream, resumer = context.stream, self.synthesis.resumer
        assert stream is not None and resumer is not None
        cid = context.context_id
        if context.resumed_at is None:
            try:
                await self._write(stream_message("stream", resumer, stream, context_id=cid))
            except BaseException:
                resumer.forget(stream)  # never begun: none could resume it
                raise
            stream.known_to_client = True
            if stream.cancelled:
                return None  # closed `immediate` before it began
            assert context.settings is not None
            run = self.synthesis.stream(
                self.method, stream.fragments(), context.settings, stream.send, guard_stalls=False
            )
            stream.start(run)
            start, heard = 0, 0
        else:
            await self._write(stream_message("resumed", resumer, stream, context_id=cid))
            start, heard = context.resumed_at
        await stream.attach(send, start, heard)
        assert stream.task is not None
        record: StreamRecord = stream.task.result()
        return record

    async def _close_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_IDLE_CHECK_S)
            for context in list(self.contexts.values()):
                if not context.reason and loop.time() - context.last_message >= self.idle_s:
                    context.finish("idle")

    async def _error(self, context_id: str | None, exc: BaseException) -> None:
        """An error message naming the context (None: the message named none we could read);
        nothing once the client is gone."""
        body = http_failure(exc, self.synthesis.retry_pushback_ms).body
        try:
            await self._write(json.dumps({"type": "error", "context_id": context_id, **body}))
        except ClientStalledError:
            self._gone = True  # it reads nothing: the socket is given up (run() sees it)
        except asyncio.CancelledError:
            if not self._gone:
                raise

    async def _write(self, data: bytes | str) -> None:
        """One frame, whole, under the socket's lock and the stall timeout."""
        if self._gone:
            raise asyncio.CancelledError()
        async with self._write_lock:
            sending = (
                self.ws.send_bytes(data) if isinstance(data, bytes) else self.ws.send_text(data)
            )
            try:
                await self.synthesis.deliver(sending)
            except Exception as exc:
                if is_ours(exc):
                    raise
                self._gone = True  # any other failure to send: the client is gone
                raise asyncio.CancelledError() from None
