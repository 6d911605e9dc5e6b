"""Options as values: how to reach a server (`ClientOptions`) and what to ask it for
(`SynthesisOptions`).

Both clients take `ClientOptions` (`TTSClient.from_options`), and every `SynthesisOptions`
becomes one `SynthesisConfig`; the voice-agent adapters take the two objects instead of
repeating their fields as keywords. Both check themselves when built, so a bad option fails
where it was written, not at the first call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from chattts_client.messages import make_config
from chattts_client.resilience import SERVICE_CONFIG
from chattts_proto.chattts.v1 import tts_pb2

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


def lexicon_value(file_or_name: str) -> str:
    """A `SynthesisConfig.lexicons` value: a W3C PLS file's text when `file_or_name` is a file
    (sent inline), else the name of a lexicon the server loaded (its file's base name without
    .pls). What looks like a path (a / or a .pls or .xml ending) but is no file is an OSError
    here, not an unknown name at the server."""
    path = Path(file_or_name)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "/" in file_or_name or os.sep in file_or_name or path.suffix in (".pls", ".xml"):
        raise FileNotFoundError(f"no lexicon file {file_or_name}")
    return file_or_name


@dataclass(frozen=True)
class SynthesisOptions:
    """Voice, speed, sampling, audio format and word timing of a call: the arguments of
    `chattts_client.make_config`, and the pronunciation lexicons (`lexicons`: each a server
    lexicon's name or a PLS document; `lexicon_value` reads a file's).

    None leaves a field to the server's default. `to_config()` builds the SynthesisConfig;
    `dataclasses.replace(options, ...)` makes a variant.
    """

    voice: str | int | None = None
    speed: float | None = None
    refine_text: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    encoding: str | int = "LINEAR16"
    sample_rate_hz: int = 0  # 0: the model's own rate
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    reference_audio: bytes | None = None
    reference_transcript: str = ""
    word_timing: bool = False
    lexicons: tuple[str, ...] = ()
    max_lag_s: float | None = None
    hard_lag_s: float | None = None
    pace_lead_s: float | None = None

    def __post_init__(self) -> None:
        self.to_config()  # parse errors (voice, encoding, voice with reference) fail here

    def to_config(self, **changes: Any) -> tts_pb2.SynthesisConfig:
        """The SynthesisConfig of these options, with `changes` (field=value) applied."""
        options = replace(self, **changes) if changes else self
        names = [f.name for f in fields(options) if f.name != "lexicons"]
        config = make_config(**{name: getattr(options, name) for name in names})
        config.lexicons.extend(options.lexicons)
        return config
