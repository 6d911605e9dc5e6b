"""Turning failures into gRPC statuses with useful details (and never a traceback)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from .convert import FieldError


async def abort_invalid(context: grpc.aio.ServicerContext, error: FieldError) -> None:
    """Abort with INVALID_ARGUMENT and a google.rpc.BadRequest naming the field."""
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=error.field_name, description=error.description
                )
            ]
        )
    )
    status = rpc_status.to_status(
        status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(error), details=[detail])
    )
    await context.abort(status.code, status.details, status.trailing_metadata)


async def abort_resource_exhausted(
    context: grpc.aio.ServicerContext, message: str, retry_pushback_ms: int
) -> None:
    """RESOURCE_EXHAUSTED with grpc-retry-pushback-ms, which gRPC retry policies honour."""
    await context.abort(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        message,
        (("grpc-retry-pushback-ms", str(retry_pushback_ms)),),
    )
