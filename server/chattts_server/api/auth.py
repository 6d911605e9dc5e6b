"""Bearer tokens: the one check (`Tokens.check`), used by every door.

Streams (gRPC `Synthesize`/`StreamingSynthesize`, `POST /v1/audio/speech`, the WebSocket) are
checked on the one way in (`Synthesis.accept`), which also counts and logs a refusal like any
other refused stream. Everything else is checked where it is served: the other gRPC methods
(ListVoices, reflection, and any method added later) by `BearerTokenInterceptor`, the other
HTTP routes by the app. Health checks stay open so Kubernetes probes need no token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
STREAM_METHODS = (
    "/chattts.v1.TextToSpeech/Synthesize",
    "/chattts.v1.TextToSpeech/StreamingSynthesize",
)
"""Checked on the way in (`Synthesis.accept`), not by the interceptor."""


class AuthError(Exception):
    """A missing (`UNAUTHENTICATED`) or wrong (`PERMISSION_DENIED`) token; `status` is the
    canonical status name."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def load_tokens(path: Path) -> Tokens:
    """One token per line; blank lines and # comments ignored. Start-up error if none."""
    tokens = tuple(
        line.strip().encode()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    )
    if not tokens:
        raise ValueError(f"{path} holds no tokens")
    return Tokens(tokens)


class Tokens:
    """The accepted bearer tokens."""

    def __init__(self, tokens: tuple[bytes, ...]) -> None:
        self._tokens = tokens

    def check(self, authorization: str | None, what: str) -> None:
        """Raise AuthError unless `authorization` (the header, `Bearer <token>`) carries an
        accepted token; `what` names the call in the log line of a wrong token."""
        if not authorization:
            raise AuthError("UNAUTHENTICATED", "missing bearer token")
        scheme, _, token = authorization.partition(" ")
        # Compare against every token in constant time so timing reveals nothing.
        ok = False
        for candidate in self._tokens:
            ok |= hmac.compare_digest(candidate, token.strip().encode())
        if scheme.lower() != "bearer" or not ok:
            log.warning("rejected %s: wrong bearer token", what)
            raise AuthError("PERMISSION_DENIED", "invalid bearer token")


def check(tokens: Tokens | None, authorization: str | None, what: str) -> None:
    """`tokens.check`, or nothing when auth is off."""
    if tokens is not None:
        tokens.check(authorization, what)


def authorization_of(metadata: Any) -> str | None:
    """The `authorization` value of gRPC invocation metadata, if any."""
    for key, value in metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


def _denying_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    async def deny(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def deny_stream(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            deny_stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            deny, handler.request_deserializer, handler.response_serializer
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            deny_stream, handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        deny, handler.request_deserializer, handler.response_serializer
    )


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """The token check on every gRPC method but health and the stream methods (those are
    checked on the way in, where a refusal is also counted as a refused stream)."""

    def __init__(self, tokens: Tokens) -> None:
        self._tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES) or method in STREAM_METHODS:
            return handler
        try:
            self._tokens.check(authorization_of(handler_call_details.invocation_metadata), method)
        except AuthError as exc:
            return _denying_handler(handler, grpc.StatusCode[exc.status], str(exc))
        return handler
