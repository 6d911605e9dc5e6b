"""uvicorn in the running event loop (the gRPC server's), without uvicorn's signal handling.

`uvicorn.Server.serve()` installs its own SIGTERM/SIGINT handlers and runs its own main loop;
the server process already owns both (drain on SIGTERM), so this drives uvicorn's `startup` and
`shutdown` directly. TLS comes from the same certificate files as gRPC; with a client CA,
clients must present a certificate (mutual TLS), as on gRPC. The limits on headers and
WebSocket messages come from `LimitsConfig` (the header limit through `protocol.py`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ...config import LimitsConfig, SecurityConfig
from .protocol import protocol_class

log = logging.getLogger(__name__)


class HTTPServerError(RuntimeError):
    """The HTTP server cannot start (port in use, bad certificate)."""


class _CloseWhenDraining:
    """The app, but once a drain began every HTTP response says `Connection: close` (uvicorn
    then closes the connection after it): a proxy's pooled connection to this replica ends
    after its last request, rather than the server closing it while idle, at the moment the
    proxy may be sending the next request on it (HTTP/1.1 has no GOAWAY)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.draining = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.draining:
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_closing)


def _listen_host(host: str) -> str:
    # gRPC spells "every interface" [::]; asyncio's "" binds every interface in both families.
    if host in ("[::]", "::"):
        return ""
    return host.strip("[]")


class HTTPServer:
    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        security: SecurityConfig,
        limits: LimitsConfig,
        idle_s: int,
    ) -> None:
        options: dict[str, Any] = {}
        if security.tls_cert is not None and security.tls_key is not None:
            options = {"ssl_certfile": str(security.tls_cert), "ssl_keyfile": str(security.tls_key)}
            if security.tls_client_ca is not None:
                options["ssl_ca_certs"] = str(security.tls_client_ca)
                options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        self._app = _CloseWhenDraining(app)
        self.config = uvicorn.Config(
            self._app,
            host=_listen_host(host),
            port=port,
            lifespan="off",
            log_config=None,  # our logging setup, not uvicorn's
            access_log=False,
            timeout_graceful_shutdown=1,
            timeout_keep_alive=idle_s,  # uvicorn's 5 s would race a proxy's reuse of the connection
            http=protocol_class(limits.max_header_bytes),
            ws_max_size=limits.max_ws_message_bytes,
            **options,
        )
        self.server = uvicorn.Server(self.config)
        self.port = 0

    async def start(self) -> int:
        """Bind and serve in the running loop; returns the port bound."""
        try:
            self.config.load()
        except (OSError, ssl.SSLError) as exc:
            raise HTTPServerError(f"cannot set up HTTP TLS: {exc}") from None
        self.server.lifespan = self.config.lifespan_class(self.config)
        try:
            await self.server.startup()
        except SystemExit:  # uvicorn exits when it cannot bind; it has logged why
            raise HTTPServerError(
                f"cannot listen for HTTP on {self.config.host or '*'}:{self.config.port}"
            ) from None
        sockets = [s for server in self.server.servers for s in (server.sockets or ())]
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    def stop_listening(self) -> None:
        """The drain's first step: close the listeners, so a proxy's next connection is refused
        (a TCP check fails, a connect retry goes to another replica). Connections already open
        stay: a request that still arrives on one is served, answered `Connection: close`, and
        the connection closes after it; idle ones close at `stop`, once the proxy has had time
        to see the replica go (`--http-linger-s`). WebSockets run on until `stop`."""
        for listener in self.server.servers:
            listener.close()
        self._app.draining = True
        for connection in list(self.server.server_state.connections):
            if not isinstance(connection, HttpToolsProtocol):
                continue  # a WebSocket: runs on until `stop`
            if connection.cycle is not None and not connection.cycle.response_complete:
                connection.shutdown()  # busy: closed after this response

    async def responses_sent(self, deadline: float) -> None:
        """Until every HTTP response under way has been sent whole, or `deadline` (loop time):
        a request that came on a kept-alive connection during the linger may not have reached
        admission yet when the drain finds no stream held, and a response's last bytes leave
        after its stream's slot is freed; `stop` would cut either. uvicorn has no event for it,
        so this polls every 50 ms. WebSockets are not responses: they end at `stop`."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline and any(
            isinstance(c, HttpToolsProtocol)
            and c.cycle is not None
            and not c.cycle.response_complete
            for c in self.server.server_state.connections
        ):
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Close the listeners and idle connections, let responses that are ending finish
        (timeout_graceful_shutdown, 1 s: the drain's grace period is over), cancel the rest."""
        if self.server.started:
            await self.server.shutdown()
