"""The errors a request can end with, shared by every layer: the text front end refuses bad
markup with `InvalidRequestError`, the engine fails a request with `EngineError`, and every
front door maps them to its protocol's status (api/errors.py). A leaf: it imports nothing."""

from __future__ import annotations


class EngineError(Exception):
    """A request failed inside the engine; the message is safe to show to the client."""


class InvalidRequestError(ValueError):
    """A request is invalid: a field the front door validates (`config.sampling.top_p`) or one
    the engine refuses (a malformed speaker embedding). `field_name` is its path in the request
    as the client spelled it; every door answers it as INVALID_ARGUMENT / 400 naming it."""

    def __init__(self, field_name: str, description: str) -> None:
        super().__init__(f"{field_name}: {description}")
        self.field_name = field_name
        self.description = description


RequestFailure = EngineError | InvalidRequestError
"""What one request alone can fail with inside the engine (the step's other requests go on)."""


class EngineUnavailableError(EngineError):
    """The engine is not ready, draining, or broken."""


class ExpiredError(EngineError):
    """A request's segment could not start in time (TextInput.expires_in_ms): the engine drops
    it before its prefill; the stream goes on."""
