"""How to reach a server: `ClientOptions` (target, TLS, token, retries, keepalive) and the gRPC
channel they describe.

Both clients take `ClientOptions` (`TTSClient.from_options`), as do the voice-agent adapters.
The options check themselves when built, so a bad option fails where it was written, not at the
first call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from chattts_client.resilience import SERVICE_CONFIG, channel_options

DEFAULT_TARGET = "localhost:50051"
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024

PathOrBytes = str | os.PathLike[str] | bytes


@dataclass(frozen=True)
class ClientOptions:
    """Where the server is and how to authorise against it.

    `ca_cert`, `client_cert` and `client_key` are PEM file paths or bytes; `ca_cert=None` with
    `tls=True` uses the system roots. `token` is sent as `authorization: Bearer <token>`.
    `tls_server_name` overrides the name checked against the server certificate.
    `service_config` is the channel's gRPC service config (default `SERVICE_CONFIG`: round
    robin, retry of UNAVAILABLE, UNKNOWN or CANCELLED before the first response, streams included; None:
    neither); `keepalive` pings a quiet connection to find a dead peer within seconds
    (chattts_client.resilience).
    """

    target: str = DEFAULT_TARGET
    tls: bool = False
    ca_cert: PathOrBytes | None = None
    client_cert: PathOrBytes | None = None
    client_key: PathOrBytes | None = None
    token: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    tls_server_name: str | None = None
    service_config: Mapping[str, Any] | None = field(default_factory=lambda: SERVICE_CONFIG)
    keepalive: bool = True

    def __post_init__(self) -> None:
        if not self.tls and (
            self.ca_cert is not None or self.client_cert is not None or self.client_key is not None
        ):
            raise ValueError("ca_cert, client_cert and client_key need tls=True")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together")
        if self.max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")

    @classmethod
    def of(cls, client: ClientOptions | str) -> ClientOptions:
        """`client` itself, or the options of a plain target string ("host:port")."""
        return cls(client) if isinstance(client, str) else client


@dataclass(frozen=True)
class ChannelSpec:
    """What both clients need to open a channel and authorise calls."""

    target: str
    options: tuple[tuple[str, Any], ...]
    credentials: grpc.ChannelCredentials | None  # None: plaintext
    metadata: tuple[tuple[str, str], ...] | None  # per-call metadata (token on plaintext)


def channel_spec(opts: ClientOptions) -> ChannelSpec:
    """The channel of `opts`; reads the certificate files now."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", opts.max_message_bytes),
        ("grpc.max_receive_message_length", opts.max_message_bytes),
        *channel_options(opts.service_config, opts.keepalive),
    ]
    if opts.tls_server_name:
        options.append(("grpc.ssl_target_name_override", opts.tls_server_name))
    if not opts.tls:
        metadata = (("authorization", f"Bearer {opts.token}"),) if opts.token else None
        return ChannelSpec(opts.target, tuple(options), None, metadata)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(opts.ca_cert),
        private_key=_read(opts.client_key),
        certificate_chain=_read(opts.client_cert),
    )
    if opts.token:
        # Call credentials travel only on secure channels; this sends
        # "authorization: Bearer <token>" through grpc.metadata_call_credentials.
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(opts.token)
        )
    return ChannelSpec(opts.target, tuple(options), credentials, None)


def _read(data: PathOrBytes | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    with open(data, "rb") as f:
        return f.read()
