"""The one place failures become statuses: the canonical (gRPC) status of each of our
exceptions (`status_of`, which the HTTP doors map on to HTTP in `http/errors.py`), and the
gRPC call ending with it (`abort_with`: useful details, never a traceback)."""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ..errors import EngineError, EngineUnavailableError, InvalidRequestError
from .admission import AdmissionRejected
from .auth import AuthError


class ClientStalledError(Exception):
    """The client took none of the audio waiting for it for the stall timeout: the stream was
    cancelled and its slot freed (`Synthesis`, `--stall-timeout-s`)."""


class ClientGoneError(Exception):
    """The client went away before its request was read (mid-upload, or before the config)."""


class ResumeError(Exception):
    """A resume refused, or a stream its client ended (CancelStream): `status` is the canonical
    status name (PERMISSION_DENIED, NOT_FOUND, OUT_OF_RANGE, FAILED_PRECONDITION, CANCELLED)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message a failure is reported with."""
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, (AuthError, ResumeError)):
        return grpc.StatusCode[exc.status], str(exc)
    if isinstance(exc, AdmissionRejected):
        if exc.code == "exhausted":
            return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, ClientStalledError):
        # A deadline the server sets on the reader's progress; not worth a retry by policy.
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)
    if isinstance(exc, EngineUnavailableError):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, EngineError):
        return grpc.StatusCode.INTERNAL, f"synthesis failed: {exc}"
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"
    if isinstance(exc, (asyncio.CancelledError, ClientGoneError)):
        return grpc.StatusCode.CANCELLED, "cancelled"
    return grpc.StatusCode.UNKNOWN, "unexpected error"


def status_name(exc: BaseException) -> str:
    """The canonical status name (also the metrics label) a failure ends a stream with."""
    return status_of(exc)[0].name


OURS = (
    InvalidRequestError,
    AuthError,
    AdmissionRejected,
    ClientStalledError,
    ResumeError,
    EngineError,
    TimeoutError,
)
"""The failures every door knows how to report (anything else is a bug: let it raise)."""


def is_ours(exc: BaseException) -> bool:
    return isinstance(exc, OURS)


async def abort_with(
    context: grpc.aio.ServicerContext, exc: BaseException, retry_pushback_ms: int = 0
) -> None:
    """End the call with the status of `exc`: a google.rpc.BadRequest naming the field for
    invalid input, grpc-retry-pushback-ms (which gRPC retry policies honour) when full."""
    code, message = status_of(exc)
    if isinstance(exc, InvalidRequestError):
        await _abort_invalid(context, exc.field_name, exc.description, message)
    elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        await context.abort(code, message, (("grpc-retry-pushback-ms", str(retry_pushback_ms)),))
    else:
        await context.abort(code, message)


async def _abort_invalid(
    context: grpc.aio.ServicerContext, field_name: str, description: str, message: str
) -> None:
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=field_name, description=description
                )
            ]
        )
    )
    status = rpc_status.to_status(
        status_pb2.Status(
            code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=message, details=[detail]
        )
    )
    await context.abort(status.code, status.details, status.trailing_metadata)
