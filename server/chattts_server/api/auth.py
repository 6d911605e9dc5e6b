"""Bearer-token authentication as a server interceptor (covers unary and streaming methods).

Health checks stay open so Kubernetes probes need no token; reflection is covered like the rest.
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


def load_tokens(path: Path) -> tuple[bytes, ...]:
    """One token per line; blank lines and # comments ignored. Start-up error if none."""
    tokens = tuple(
        line.strip().encode()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    )
    if not tokens:
        raise ValueError(f"{path} holds no tokens")
    return tokens


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
    def __init__(self, tokens: tuple[bytes, ...]) -> None:
        self._tokens = tokens

    def _authorized(self, token: bytes) -> bool:
        # Compare against every token in constant time so timing reveals nothing.
        ok = False
        for candidate in self._tokens:
            ok |= hmac.compare_digest(candidate, token)
        return ok

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        header = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
        if not header:
            return _denying_handler(
                handler, grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not self._authorized(token.strip().encode()):
            log.warning("rejected a call to %s with a wrong token", method)
            return _denying_handler(
                handler, grpc.StatusCode.PERMISSION_DENIED, "invalid bearer token"
            )
        return handler
