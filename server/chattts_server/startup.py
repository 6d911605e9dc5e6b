"""What the server is built from at start-up, each a `StartupError` naming the flag when it
cannot be: gRPC's channel options, TLS credentials, bearer tokens, lexicons, reserved ports."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import grpc

from .api.auth import Tokens, load_tokens
from .api.voices import MAX_REFERENCE_S
from .config import SecurityConfig, ServerConfig
from .text.duration import slot_tokens_needed
from .text.lexicon_library import LexiconFileError, LexiconLibrary

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """The server cannot start (bad certificate path, unreadable token file, port in use)."""


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    n, limits = config.network, config.limits
    options = [
        ("grpc.max_receive_message_length", limits.max_receive_bytes),
        ("grpc.max_send_message_length", limits.max_send_bytes),
        ("grpc.keepalive_time_ms", int(n.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(n.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        # chattts_client pings after 3 s without data (to find a dead peer within 5 s). A client
        # pinging faster than this, more than max_ping_strikes times while we send nothing, gets
        # GOAWAY too_many_pings. The margin is for a starved process: pings 3 s apart on the
        # wire read together after a stall count as one strike each (with 2000 ms and 2
        # strikes, such a GOAWAY left a quiet stream without keepalive on a loaded machine).
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
        ("grpc.http2.max_ping_strikes", 10),
        ("grpc.so_reuseport", 0),
    ]
    if n.max_connection_age_s > 0:
        options.append(("grpc.max_connection_age_ms", int(n.max_connection_age_s * 1000)))
        options.append(
            ("grpc.max_connection_age_grace_ms", int(n.max_connection_age_grace_s * 1000))
        )
    return options


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) that does not listen: the port is ours, connections to it
    are refused."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def credentials(sec: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS (mutual with --tls-client-ca) where --tls-cert and --tls-key are given."""
    if sec.tls_cert is None or sec.tls_key is None:
        return None
    chain = _read(sec.tls_cert, "--tls-cert")
    key = _read(sec.tls_key, "--tls-key")
    client_ca = _read(sec.tls_client_ca, "--tls-client-ca") if sec.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StartupError(f"cannot read {what} {path}: {exc.strerror}") from None


def warn_if_slots_too_short(cfg: ServerConfig) -> None:
    needed = slot_tokens_needed(cfg.engine.max_new_tokens, MAX_REFERENCE_S)
    if cfg.engine.max_tokens < needed:
        log.warning(
            "--max-tokens %d is below the %d positions the longest utterance under "
            "--max-new-tokens %d needs with a %g s reference voice: such utterances are cut "
            "short (finish_reason max_tokens)",
            cfg.engine.max_tokens,
            needed,
            cfg.engine.max_new_tokens,
            MAX_REFERENCE_S,
        )


def load_server_tokens(cfg: ServerConfig) -> Tokens | None:
    """The accepted bearer tokens (--auth-token-file), or None when auth is off."""
    if cfg.security.auth_token_file is None:
        return None
    try:
        return load_tokens(cfg.security.auth_token_file)
    except (OSError, ValueError) as exc:
        raise StartupError(f"--auth-token-file: {exc}") from None


def load_lexicons(cfg: ServerConfig) -> LexiconLibrary:
    """The --lexicon files, compiled; StartupError naming the file and line of a bad one."""
    try:
        library = LexiconLibrary.load(cfg.lexicon)
    except LexiconFileError as exc:
        raise StartupError(f"--lexicon {exc}") from None
    for name in library.names:
        lexicon = library.get(name)
        assert lexicon is not None
        log.info("lexicon %s: %d graphemes", name, lexicon.num_graphemes)
    return library
