"""uvicorn's httptools protocol with what an exposed server needs and uvicorn lacks.

- A limit on the request line and headers (`--max-header-bytes`): 431 Request Header Fields
  Too Large, then the connection is closed. uvicorn has none for httptools (h11's limit
  answers 400), so a client could send megabytes of headers.
- Malformed HTTP (a chunk size of `zz`, a bad request line) is answered 400 and logged in one
  INFO line (uvicorn logs a WARNING for each: any client could fill the log).
- The ASGI extension `chattts.abort` in each request's scope: a function that drops the
  connection at once. A streamed body that must be cut (a failure after the first byte, a
  stalled reader) is ended with it; returning with the body unfinished would have uvicorn log
  an error, and a graceful close would wait on the very client that stopped reading.
- A fixed socket send buffer (SEND_BUFFER_BYTES). Left to autotuning, Linux grows it to
  megabytes, which the kernel accepts from a client that reads nothing: tens of seconds of
  PCM (minutes of MP3) would be generated into it before a write waits and the stall timeout
  can start. 128 KiB (the kernel doubles it) still carries 2.6 MB/s at 100 ms of round trip,
  over ten times the largest audio stream we send.

The WebSocket handshake is parsed here too, so the header limit and the send buffer cover it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

log = logging.getLogger(__name__)

ABORT_EXTENSION = "chattts.abort"
SEND_BUFFER_BYTES = 128 << 10


class _HeadTooLarge(Exception):
    """Raised inside the parser's callback; turned into the 431."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 16 << 10
    """Set on the class `protocol_class` makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._head_bytes = 0
        self._head_too_large = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        super().connection_made(transport)  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        if size > self.max_header_bytes:
            self._head_too_large = True
            raise _HeadTooLarge()
        super().on_headers_complete()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope.setdefault("extensions", {})[ABORT_EXTENSION] = self.transport.abort

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if self._head_too_large:
                self._refuse(431, "Request header fields too large.")
                return
            # A request in flight notices the closed connection and logs that itself.
            in_flight = self.cycle is not None and not self.cycle.response_complete
            log.log(
                logging.DEBUG if in_flight else logging.INFO,
                "malformed HTTP request from %s: %s",
                _peer(self.client),
                str(exc)[:100],
            )
            self._refuse(400, "Invalid HTTP request received.")
            return
        if self._in_head:  # all of `data` is head: the head is still incomplete
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(431, "Request header fields too large.")

    def _refuse(self, status: int, message: str) -> None:
        if status == 431:
            log.info(
                "refused a request from %s: headers over %d bytes",
                _peer(self.client),
                self.max_header_bytes,
            )
        body = message.encode("ascii")
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


def protocol_class(max_header_bytes: int) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` (uvicorn makes one per connection)."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes},
    )


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
