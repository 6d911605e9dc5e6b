"""grpc.health.v1 that also says, once the model is ready, how its decode step runs, and that
lets its watchers go when the server drains.

The status stays the standard one (probes read only that). Each `Check` reply carries initial
metadata from `describe`: `chattts-decode-graphs` ('cuda', 'eager' or 'off', as
`ModelInfo.decode_graphs`) and, where CUDA graph capture failed at warm-up and the server
decodes eagerly instead, `chattts-decode-graphs-error` with the reason
(`grpcurl -v ... grpc.health.v1.Health/Check` shows both).

`drain` is the first step of a graceful stop: every service NOT_SERVING, and each `Watch` ends
(OK) once it has sent that. A watch left open would hold its connection through the whole grace
period, and the process with it; a watcher that wants more watches again and finds the port shut.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from ..engine.protocol import ModelInfo

SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def _header_value(text: str) -> str:
    """Metadata values are printable ASCII."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:300]


class HealthServicer(health_aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._open_watches = 0
        self._no_watches = asyncio.Event()
        self._no_watches.set()

    def describe(self, model: ModelInfo) -> None:
        """The model is loaded and warmed: publish how it decodes."""
        metadata = [("chattts-decode-graphs", model.decode_graphs)]
        if model.decode_graphs_error:
            metadata.append(
                ("chattts-decode-graphs-error", _header_value(model.decode_graphs_error))
            )
        self._metadata = tuple(metadata)

    async def Check(  # noqa: N802 - the gRPC method's name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        if self._metadata:
            await context.send_initial_metadata(self._metadata)
        return await super().Check(request, context)  # type: ignore[func-returns-value]

    async def Watch(  # noqa: N802 - the gRPC method's name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """The base class's Watch (its bookkeeping too), but it ends once draining."""
        condition = self._server_watchers[request.service]
        self._watcher_count_by_service[request.service] += 1
        self._open_watches += 1
        self._no_watches.clear()
        last_status = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(request.service, SERVICE_UNKNOWN)
                    if status != last_status:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                        last_status = status
                    if self._gracefully_shutting_down:
                        return
                    await condition.wait()
        finally:
            self._watcher_count_by_service[request.service] -= 1
            if self._watcher_count_by_service[request.service] == 0:
                del self._server_watchers[request.service]
                del self._watcher_count_by_service[request.service]
            self._open_watches -= 1
            if self._open_watches == 0:
                self._no_watches.set()

    async def drain(self, timeout_s: float = 1.0) -> None:
        """Every service NOT_SERVING for good; returns once each watch has been told and ended
        (at most `timeout_s`: a watcher that reads nothing does not hold up the drain)."""
        await self.enter_graceful_shutdown()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._no_watches.wait()
