"""Many streams on one WebSocket, from Python: the server's contexts (its
api/http/ws_contexts.py), for a voice agent that keeps one socket for a session and opens a
context per turn. Barge-in closes the old turn's context `immediate` and the next one starts at
once, with no new handshake.

    async with await ContextSocket.connect("ws://localhost:8000/v1/audio/speech/stream") as ws:
        turn = await ws.open("t1", voice="seed:1", audio_format="pcm")
        await turn.send("Let me check that for you.")
        await turn.close()                   # finish what was sent (immediate=True: stop now)
        async for event in turn:             # ContextAudio, and its JSON messages as dicts
            ...
        turn.closed                          # its `context_closed` message

Each context's events are its own: audio frames (the header naming the context taken off) and
the JSON messages naming it, in order; the iteration ends after `context_closed`, and raises
ContextError where the server sent an error for the context (a bad config, over
--ws-max-contexts, a full server). An error that names no context (an id the server could not
read) is raised by the socket's next call. Over gRPC, the client library's streams already
share one HTTP/2 connection; this is the same for WebSocket users.

`ContextSocket.connect(..., resumable=True)`: every context outlives a dropped socket. When
the connection drops (no clean close), the socket connects again (to the same replica behind a
proxy: `?stream_id=` the upgrade's `chattts-stream-id`), resumes each open context from the
samples received (PCM: 16-bit samples are counted) and sends its text messages again (each
carries its `seq`: the server applies each once); the context's iteration sees a `resumed`
message and goes on, nothing lost or repeated. It tries until the server's resume window has
passed; then the open contexts end with the ConnectionClosed. A context whose socket dropped
before its `stream` message came cannot be resumed and ends so too. One closed `immediate`
just before the drop is resumed with its close sent again; where the server had let it go
already (its resume refused), it ends with a `context_closed` of reason `immediate` made here.

Needs `websockets` (`pip install "chattts-stream[websocket]"`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

try:
    from websockets.asyncio.client import ClientConnection, connect
    from websockets.exceptions import ConnectionClosed, InvalidHandshake
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        'chattts_client.ws_contexts needs websockets: pip install "chattts-stream[websocket]"'
    ) from exc

__all__ = ["ContextAudio", "ContextError", "ContextSocket", "Context", "audio_frame_parts"]

_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)
_REFUSED_RESUME = ("not_found", "invalid_api_key", "out_of_range")
_NOT_COUNTED = ("stream", "resumed", "context_closed", "error")
"""A context's messages a resume does not count among those received since its audio."""


@dataclass(frozen=True)
class ContextAudio:
    """One audio frame of a context, in the context's `audio_format` (`pcm`: 16-bit
    little-endian mono at the model's rate)."""

    context_id: str
    audio: bytes


class ContextError(Exception):
    """The server's error message for a context (`context_id` None: one it could not read)."""

    def __init__(self, context_id: str | None, error: dict[str, Any]) -> None:
        self.context_id = context_id
        self.code = str(error.get("code", ""))
        self.error = error
        where = f"context {context_id!r}" if context_id is not None else "a context message"
        super().__init__(f"{where}: {self.code}: {error.get('message', '')}")


def audio_frame_parts(frame: bytes) -> tuple[str, bytes]:
    """A context audio frame's context id and audio: `[H: uint16 LE][n: uint8][id: n bytes of
    UTF-8][zeros up to H][audio]`."""
    header, n = struct.unpack_from("<HB", frame)
    return frame[3 : 3 + n].decode(), frame[header:]


class Context:
    """One context on a ContextSocket: text in, its events out (iterate it)."""

    def __init__(self, socket: ContextSocket, context_id: str) -> None:
        self.context_id = context_id
        self.closed: dict[str, Any] | None = None
        """Its `context_closed` message, once the server has sent it."""
        self.stream: dict[str, Any] | None = None
        """Its `stream` message (id, token, window), when it is resumable."""
        self._socket = socket
        self._events: asyncio.Queue[ContextAudio | dict[str, Any] | BaseException] = asyncio.Queue()
        self._sent: list[dict[str, Any]] = []
        """Its messages after the config, numbered: sent again after a resume."""
        self._samples = 0
        self._since_audio = 0
        self._stopped = False
        """Closed `immediate`: a resume the server refuses (it let the stream go) ends it."""

    async def send(self, text: str, **fields: Any) -> None:
        """A text message: `flush`, `clear`, `mark`, `segment`, `expires_in_ms` as the server's
        `text` message takes them. Whitespace-only text is text (LLM tokens)."""
        await self._message("text", text=text, **fields)

    async def flush(self) -> None:
        """Speak what was sent so far, without waiting for a sentence's end."""
        await self._message("flush")

    async def clear(self) -> None:
        """Drop the text not yet spoken and stop the utterance speaking (barge-in within a
        context; `close(immediate=True)` ends the context too)."""
        await self._message("clear")

    async def mark(self, name: str) -> None:
        """A mark, answered at the audio sent before it."""
        await self._message("mark", name=name)

    async def replace(self, segment: str, text: str, **fields: Any) -> None:
        """Replace a segment's text (`if_started`, `expires_in_ms` as the server takes them)."""
        await self._message("replace", segment=segment, text=text, **fields)

    async def close(self, immediate: bool = False) -> None:
        """Finish what was sent, then close; `immediate`: stop now (barge-in)."""
        self._stopped = immediate
        await self._message("close_context", immediate=immediate)

    def __aiter__(self) -> AsyncIterator[ContextAudio | dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ContextAudio | dict[str, Any]]:
        while True:
            event = await self._events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if event is self.closed:
                return

    async def _message(self, kind: str, **fields: Any) -> None:
        message = {"type": kind, "context_id": self.context_id, **fields}
        if self._socket.resumable:
            if kind != "close_context":
                message["seq"] = 1 + sum(1 for m in self._sent if "seq" in m)
            self._sent.append(message)
        await self._socket._send(message)

    def _post(self, event: ContextAudio | dict[str, Any] | BaseException) -> None:
        if isinstance(event, ContextAudio):
            self._samples += len(event.audio) // 2
            self._since_audio = 0
        elif isinstance(event, dict) and event.get("type") not in _NOT_COUNTED:
            self._since_audio += 1
        self._events.put_nowait(event)

    def _resume_messages(self) -> list[dict[str, Any]]:
        """What a new socket sends to resume it: `resume`, then its messages again."""
        assert self.stream is not None
        resume = {
            "type": "resume",
            "context_id": self.context_id,
            "stream_id": self.stream["stream_id"],
            "resume_token": self.stream["resume_token"],
            "sample_offset": self._samples,
            "events_received": self._since_audio,
        }
        return [resume, *self._sent]


class ContextSocket:
    """One WebSocket to the server's `/v1/audio/speech/stream` carrying many contexts."""

    def __init__(
        self, ws: ClientConnection, url: str, headers: dict[str, str] | None, first: dict[str, Any]
    ) -> None:
        self._ws, self._url, self._headers, self._first = ws, url, headers, first
        self.resumable = first.get("resumable") is True
        self._sticky = ws.response.headers.get("chattts-stream-id") if ws.response else None
        """The id the upgrade named: a proxy sends a socket naming it to the same replica."""
        self._contexts: dict[str, Context] = {}
        self._failure: BaseException | None = None
        self._error: ContextError | None = None
        """An error naming no context of ours (a message the server could not read)."""
        self._reconnecting = False
        self._ended = False
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(
        cls, url: str, *, api_key: str | None = None, resumable: bool = False, **config: Any
    ) -> ContextSocket:
        """Open the socket; `config` (any field of a stream's config: voice, audio_format...)
        is the socket's, which a context opened without its own takes. `resumable`: its
        contexts outlive a dropped connection (the module's docstring)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        first = {"type": "config", "contexts": True, **config}
        if resumable:
            first["resumable"] = True
        ws = await connect(url, additional_headers=headers, max_size=None)
        await ws.send(json.dumps(first))
        return cls(ws, url, headers, first)

    async def open(self, context_id: str, **config: Any) -> Context:
        """A new context; with `config`, its own config (else the socket's). Its errors (over
        the limit, a full server, a bad config) come out of its iteration as ContextError."""
        if context_id in self._contexts:
            raise ValueError(f"context {context_id!r} is open on this socket")
        context = self._contexts[context_id] = Context(self, context_id)
        if config:
            await self._send({"type": "config", "context_id": context_id, **config})
        return context

    async def end(self) -> None:
        """Every context finishes what was sent; the server then closes the socket."""
        self._ended = True
        await self._send({"type": "end"})

    async def aclose(self) -> None:
        """Close the socket now (its contexts end: the server stops them)."""
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def __aenter__(self) -> ContextSocket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, message: dict[str, Any]) -> None:
        if self._failure is not None:
            raise self._failure  # the socket is closed
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._reconnecting:
            return  # a resumable context's: sent again once the socket is back
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            if not self.resumable:
                raise  # else the reader resumes, and sends it again

    async def _read(self) -> None:
        """Each frame to its context, until the socket closes: resumed where it dropped and
        its contexts are resumable, else open contexts end with the ConnectionClosed."""
        while True:
            closed = await self._read_socket()
            if not (self.resumable and closed.rcvd is None and await self._resume()):
                break
        self._failure = self._failure or closed
        for context in self._contexts.values():
            context._post(closed)
        self._contexts.clear()

    async def _resume(self) -> bool:
        """A new socket resuming every open context; False once the window passed first."""
        self._reconnecting = True
        contexts = [c for c in self._contexts.values() if c.stream is not None]
        for context in [c for c in self._contexts.values() if c.stream is None]:
            context._post(ConnectionClosed(None, None))  # never begun: none could resume it
            del self._contexts[context.context_id]
        if not contexts:
            return False
        window_s = min(float(c.stream["resume_window_s"]) for c in contexts if c.stream)
        deadline = time.monotonic() + window_s
        url = self._url
        if self._sticky:
            url += ("&" if "?" in url else "?") + urlencode({"stream_id": self._sticky})
        for attempt in range(1000):
            ws: ClientConnection | None = None
            try:
                ws = await connect(url, additional_headers=self._headers, max_size=None)
                await ws.send(json.dumps(self._first))
                for context in contexts:
                    for message in context._resume_messages():
                        await ws.send(json.dumps(message))
                if self._ended:
                    await ws.send(json.dumps({"type": "end"}))
            except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError):
                if ws is not None:
                    await ws.close()  # dropped again while resuming: the next try
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
                continue
            self._ws, self._reconnecting = ws, False
            return True
        return False

    async def _read_socket(self) -> ConnectionClosed:
        """Each frame of the socket now open to its context, until it closes: how."""
        try:
            async for message in self._ws:
                if isinstance(message, bytes):
                    context_id, audio = audio_frame_parts(message)
                    self._deliver(context_id, ContextAudio(context_id, audio))
                    continue
                event = json.loads(message)
                context_id = event.get("context_id")
                if event.get("type") == "error":
                    error = ContextError(context_id, event.get("error") or {})
                    if context_id is None or context_id not in self._contexts:
                        self._error = error  # raised by the next call, once
                        continue
                    if error.code in _REFUSED_RESUME and self._contexts[context_id]._stopped:
                        # Its immediate close had reached the server, which let it go.
                        closed = {"type": "context_closed", "context_id": context_id}
                        self._deliver(context_id, closed | {"reason": "immediate"})
                        continue
                    self._deliver(context_id, error)
                    if error.code in _REFUSED_RESUME:  # no context_closed follows
                        del self._contexts[context_id]
                elif context_id is not None:
                    self._deliver(context_id, event)
            return self._ws.protocol.close_exc  # a clean close (1000)
        except ConnectionClosed as exc:
            return exc

    def _deliver(
        self, context_id: str, event: ContextAudio | dict[str, Any] | ContextError
    ) -> None:
        context = self._contexts.get(context_id)
        if context is None:
            return
        context._post(event)
        if isinstance(event, dict) and event.get("type") == "stream":
            context.stream = event
        if isinstance(event, dict) and event.get("type") == "context_closed":
            context.closed = event
            del self._contexts[context_id]  # its id may be used again
