"""Failures as OpenAI error objects: `{"error": {"message", "type", "param", "code"}}`.

The status comes from the one exception -> canonical status map (`api/errors.status_of`) and
the canonical status -> HTTP table Google's API gateways use, so a failure reads the same over
gRPC and HTTP: INVALID_ARGUMENT 400 (with `param` naming the field), UNAUTHENTICATED 401,
PERMISSION_DENIED 403, NOT_FOUND 404 and OUT_OF_RANGE or FAILED_PRECONDITION 400 (a WebSocket
resume), RESOURCE_EXHAUSTED 429 (with Retry-After), UNAVAILABLE 503 (loading or
draining), DEADLINE_EXCEEDED 504, INTERNAL 500. A body over `--max-body-bytes` is the one HTTP
answer of its own: 413 (an INVALID_ARGUMENT in metrics), and the connection is closed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import InvalidRequestError
from ..errors import status_of

# canonical status -> (HTTP status, OpenAI error type, code)
_BY_STATUS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error", "invalid_value"),
    "UNAUTHENTICATED": (401, "invalid_request_error", "invalid_api_key"),
    "PERMISSION_DENIED": (403, "invalid_request_error", "invalid_api_key"),
    "NOT_FOUND": (404, "invalid_request_error", "not_found"),
    "OUT_OF_RANGE": (400, "invalid_request_error", "out_of_range"),
    "FAILED_PRECONDITION": (400, "invalid_request_error", "failed_precondition"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error", "server_full"),
    "UNAVAILABLE": (503, "service_unavailable_error", "unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout_error", "timeout"),
    "CANCELLED": (499, "cancelled", "cancelled"),
    "INTERNAL": (500, "server_error", "synthesis_failed"),
}
_UNKNOWN = (500, "server_error", "internal_error")


class PayloadTooLargeError(InvalidRequestError):
    """The request body is over `--max-body-bytes`: 413."""


@dataclass(frozen=True)
class HTTPFailure:
    """What an HTTP response (or a WebSocket error event) says about a failure."""

    status: str
    """The canonical status name (gRPC's), as in metrics."""
    status_code: int
    body: dict[str, dict[str, str | None]]
    headers: dict[str, str]

    @property
    def message(self) -> str:
        return str(self.body["error"]["message"])


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def failure(status: str, message: str, param: str | None = None) -> HTTPFailure:
    """The failure for a canonical status name (`grpc.StatusCode.name`)."""
    http_status, error_type, code = _BY_STATUS.get(status, _UNKNOWN)
    return HTTPFailure(status, http_status, error_body(message, error_type, param, code), {})


def http_failure(exc: BaseException, retry_after_ms: int = 0) -> HTTPFailure:
    """The failure for one of our exceptions (`api.errors.is_ours`)."""
    code, message = status_of(exc)
    param = exc.field_name if isinstance(exc, InvalidRequestError) else None
    result = failure(code.name, message, param)
    if isinstance(exc, PayloadTooLargeError):
        # Closed after the answer: the rest of the body is not read.
        result = HTTPFailure(result.status, 413, result.body, {"Connection": "close"})
    if result.status_code == 429:
        # Retry-After is whole seconds (RFC 9110); the OpenAI SDKs read retry-after-ms first.
        result.headers["Retry-After"] = str(max(1, math.ceil(retry_after_ms / 1000)))
        result.headers["retry-after-ms"] = str(retry_after_ms)
    return result
