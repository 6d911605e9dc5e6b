"""grpc.health.v1 that also says, once the model is ready, how its decode step runs.

The status stays the standard one (probes read only that). Each `Check` reply carries initial
metadata from `describe`: `chattts-decode-graphs` ('cuda', 'eager' or 'off', as
`ModelInfo.decode_graphs`) and, where CUDA graph capture failed at warm-up and the server
decodes eagerly instead, `chattts-decode-graphs-error` with the reason
(`grpcurl -v ... grpc.health.v1.Health/Check` shows both).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from ..engine.protocol import ModelInfo


def _header_value(text: str) -> str:
    """Metadata values are printable ASCII."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:300]


class HealthServicer(health_aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self._metadata: tuple[tuple[str, str], ...] = ()

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
