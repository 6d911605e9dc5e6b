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

Needs `websockets` (`pip install "chattts-stream[websocket]"`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

try:
    from websockets.asyncio.client import ClientConnection, connect
    from websockets.exceptions import ConnectionClosed
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        'chattts_client.ws_contexts needs websockets: pip install "chattts-stream[websocket]"'
    ) from exc

__all__ = ["ContextAudio", "ContextError", "ContextSocket", "Context", "audio_frame_parts"]


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
        self._socket = socket
        self._events: asyncio.Queue[ContextAudio | dict[str, Any] | BaseException] = asyncio.Queue()

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
        await self._socket._send({"type": kind, "context_id": self.context_id, **fields})

    def _post(self, event: ContextAudio | dict[str, Any] | BaseException) -> None:
        self._events.put_nowait(event)


class ContextSocket:
    """One WebSocket to the server's `/v1/audio/speech/stream` carrying many contexts."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._contexts: dict[str, Context] = {}
        self._failure: BaseException | None = None
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, url: str, *, api_key: str | None = None, **config: Any) -> ContextSocket:
        """Open the socket; `config` (any field of a stream's config: voice, audio_format...)
        is the socket's, which a context opened without its own takes."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        ws = await connect(url, additional_headers=headers, max_size=None)
        await ws.send(json.dumps({"type": "config", "contexts": True, **config}))
        return cls(ws)

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
            raise self._failure
        await self._ws.send(json.dumps(message))

    async def _read(self) -> None:
        """Each frame to its context, until the socket closes (open contexts then end with
        the ConnectionClosed)."""
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
                        self._failure = error
                        continue
                    self._deliver(context_id, error)
                elif context_id is not None:
                    self._deliver(context_id, event)
            closed: BaseException = self._ws.protocol.close_exc  # a clean close (1000)
        except ConnectionClosed as exc:
            closed = exc
        self._failure = self._failure or closed
        for context in self._contexts.values():
            context._post(closed)
        self._contexts.clear()

    def _deliver(
        self, context_id: str, event: ContextAudio | dict[str, Any] | ContextError
    ) -> None:
        context = self._contexts.get(context_id)
        if context is None:
            return
        context._post(event)
        if isinstance(event, dict) and event.get("type") == "context_closed":
            context.closed = event
            del self._contexts[context_id]  # its id may be used again
