"""uvicorn in the running event loop (the gRPC server's), without uvicorn's signal handling.

`uvicorn.Server.serve()` installs its own SIGTERM/SIGINT handlers and runs its own main loop;
the server process already owns both (drain on SIGTERM), so this drives uvicorn's `startup` and
`shutdown` directly. TLS comes from the same certificate files as gRPC; with a client CA,
clients must present a certificate (mutual TLS), as on gRPC. The limits on headers and
WebSocket messages come from `LimitsConfig` (the header limit through `protocol.py`).
"""

from __future__ import annotations

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


def _listen_host(host: str) -> str:
    # gRPC spells "every interface" [::]; asyncio's "" binds every interface in both families.
    if host in ("[::]", "::"):
        return ""
    return host.strip("[]")


class HTTPServer:
    def __init__(
        self, app: Any, host: str, port: int, security: SecurityConfig, limits: LimitsConfig
    ) -> None:
        options: dict[str, Any] = {}
        if security.tls_cert is not None and security.tls_key is not None:
            options = {"ssl_certfile": str(security.tls_cert), "ssl_keyfile": str(security.tls_key)}
            if security.tls_client_ca is not None:
                options["ssl_ca_certs"] = str(security.tls_client_ca)
                options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        self.config = uvicorn.Config(
            app,
            host=_listen_host(host),
            port=port,
            lifespan="off",
            log_config=None,  # our logging setup, not uvicorn's
            access_log=False,
            timeout_graceful_shutdown=1,
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
        (a TCP check fails, a connect retry goes to another replica), and close idle keep-alive
        connections so no proxy reuses one. Requests in progress keep their connection until
        their response ends; WebSockets run on until `stop` (the grace period)."""
        for listener in self.server.servers:
            listener.close()
        for connection in list(self.server.server_state.connections):
            if isinstance(connection, HttpToolsProtocol):
                connection.shutdown()  # idle: closed now; busy: closed after this response

    async def stop(self) -> None:
        """Close the listeners and idle connections, let responses that are ending finish
        (timeout_graceful_shutdown, 1 s: the drain's grace period is over), cancel the rest."""
        if self.server.started:
            await self.server.shutdown()
