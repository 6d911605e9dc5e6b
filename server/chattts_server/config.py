"""Server configuration: one dataclass tree, built once from the command line, passed down.

Each field says everything about itself once, with `option(...)`: its default, help line,
choices or bounds; `config_cli` makes the command line from that, `validate` checks every bound,
and only rules between fields are written out (each section's `check`). No module reads the
environment at import time; `main` builds a `ServerConfig` and hands it to whoever needs it.
A leaf but for `defaults` (the numbers other layers use too) and `config_fields` (tests/unit/test_import_graph.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_fields import check as _check
from .config_fields import check_value as _check_value
from .config_fields import option
from .config_model import ModelConfig
from .defaults import (
    CHUNK_TOKEN_BOUNDS,
    FIRST_CHUNK_TOKENS,
    FIRST_LOOKAHEAD_TOKENS,
    LOOKAHEAD_TOKENS,
    MAX_CHUNK_TOKENS,
    check_chunk_sizes,
)
from .defaults import (
    ConfigError as ConfigError,
)


@dataclass(frozen=True)
class EngineConfig:
    max_streams: int = option(
        16, "streams generating at once; also the number of KV-cache slots", bounds=(1, 1024)
    )
    # The default fits the longest piece the text is cut into under max_new_tokens, its prompt
    # and a 10 s reference voice (text.duration.slot_tokens_needed: 1379 for 768).
    max_tokens: int = option(
        1536,
        "KV-cache positions per slot: prompt plus audio tokens of one sentence",
        bounds=(64, 8192),
    )
    max_new_tokens: int = option(
        768,
        "default and ceiling of audio tokens per sentence, 47 a second of speech",
        bounds=(1, None),
    )
    prefill_chunk_tokens: int = option(
        256,
        "prefill long prompts this many tokens at a time, between decode steps",
        bounds=(16, 4096),
    )
    interactive_hold_tokens: int = option(
        64,
        "while a PRIORITY_INTERACTIVE utterance waits for its first audio (for at most this "
        "many tokens of a pass), less urgent streams skip decode steps, so its steps run at a "
        "small batch; 0 = off",
        bounds=(0, 4096),
    )
    output_buffer_chunks: int = option(
        8, "audio chunks buffered per stream before it waits for its reader", bounds=(1, 1024)
    )
    warmup: bool = option(True, "skip the start-up warm-up generation")
    first_chunk_tokens: int = option(
        FIRST_CHUNK_TOKENS,
        "audio tokens in an utterance's first chunk; a request may set its own",
        bounds=CHUNK_TOKEN_BOUNDS["first_chunk_tokens"],
    )
    max_chunk_tokens: int = option(
        MAX_CHUNK_TOKENS,
        "cap on audio tokens per chunk; a request may set its own",
        bounds=CHUNK_TOKEN_BOUNDS["max_chunk_tokens"],
    )
    lookahead_tokens: int = option(
        LOOKAHEAD_TOKENS,
        "tokens generated past a chunk before it is decoded; a request may set its own",
        bounds=CHUNK_TOKEN_BOUNDS["lookahead_tokens"],
    )
    first_lookahead_tokens: int = option(
        FIRST_LOOKAHEAD_TOKENS,
        "the first chunk's lookahead (at most --lookahead-tokens): fewer steps to first audio; "
        "a request that sets its own lookahead uses it for every chunk",
        bounds=CHUNK_TOKEN_BOUNDS["first_lookahead_tokens"],
    )
    vocoder: str = option(
        "vocos",
        "mel-to-audio vocoder: ChatTTS's Vocos, or HiFi-GAN from a checkpoint",
        choices=("vocos", "hifigan"),
    )
    hifigan_checkpoint: Path | None = option(
        None,
        "HiFi-GAN V1 generator (100-band 24 kHz mel, hop 256) for --vocoder hifigan",
        unset="none",
    )
    cuda_graphs: bool = option(
        True, "capture the decode step as CUDA graphs at warm-up; CUDA only", switch="on-off"
    )

    def check(self) -> None:
        _check(self.max_new_tokens < self.max_tokens, "--max-new-tokens must be < --max-tokens")
        check_chunk_sizes(self.first_chunk_tokens, self.max_chunk_tokens, "--first-chunk-tokens")
        _check(
            self.first_lookahead_tokens <= self.lookahead_tokens,
            "--first-lookahead-tokens must be <= --lookahead-tokens",
        )
        _check(
            self.vocoder != "hifigan" or self.hifigan_checkpoint is not None,
            "--vocoder hifigan needs --hifigan-checkpoint",
        )


@dataclass(frozen=True)
class AdmissionConfig:
    max_queue: int = option(
        16,
        "streams that may wait for a slot; beyond, RESOURCE_EXHAUSTED at once",
        bounds=(0, 100_000),
    )
    reserved_slots: int = option(
        0,
        "of --max-streams, places only PRIORITY_INTERACTIVE streams may take (navigation "
        "prompts find one while a backlog holds the rest); must be < --max-streams",
        bounds=(0, 1023),
    )
    retry_pushback_ms: int = option(
        500, "grpc-retry-pushback-ms sent with RESOURCE_EXHAUSTED", bounds=(0, 600_000)
    )
    grace_s: float = option(
        30.0, "on SIGTERM, streams in flight get this long to finish, in seconds", bounds=(0, 3600)
    )
    http_linger_s: float = option(
        2.0,
        "on SIGTERM, HTTP keep-alive connections already open stay open at least this long "
        "(within --grace-s): a request still sent on one is served and answered Connection: "
        "close, so a proxy has seen the replica go before the idle ones close under it",
        bounds=(0, 600),
    )


@dataclass(frozen=True)
class LimitsConfig:
    max_text_chars: int = option(
        4000, "characters per text message and per Synthesize request", bounds=(1, 1_000_000)
    )
    max_stream_chars: int = option(
        100_000, "characters over the whole life of one StreamingSynthesize stream"
    )
    max_receive_bytes: int = option(
        1 << 20,
        "largest request message accepted; larger get RESOURCE_EXHAUSTED",
        bounds=(1024, 1 << 30),
    )
    max_send_bytes: int = option(8 << 20, "largest response message sent", bounds=(1024, 1 << 30))
    # 2 MiB holds the largest reference clip (960 KiB) in base64 with its text.
    max_body_bytes: int = option(
        2 << 20,
        "largest HTTP request body; larger get 413, from Content-Length before it is read",
        bounds=(1024, 1 << 30),
    )
    max_header_bytes: int = option(
        16 << 10,
        "largest HTTP request line and headers together; larger get 431",
        bounds=(1024, 1 << 24),
    )
    max_ws_message_bytes: int = option(
        2 << 20,
        "largest WebSocket message; larger close the socket with 1009",
        bounds=(1024, 1 << 30),
    )
    ws_max_contexts: int = option(
        8,
        "contexts open at once on one WebSocket; each is a stream of its own (admitted, limited "
        "and prioritised as one)",
        bounds=(1, 1024),
    )
    ws_context_idle_s: float = option(
        60.0,
        "close a WebSocket context that has had no message this long, in seconds, once what was "
        "sent is spoken; 0 = never",
        bounds=(0, 86400),
    )
    stall_timeout_s: float = option(
        30.0,
        "cancel a stream, freeing its slot, whose client has taken none of the audio waiting "
        "for it this long, in seconds; 0 = never",
        bounds=(0, 3600),
    )
    resume_window_s: float = option(
        20.0,
        "keep a resumable stream (SynthesisConfig.resumable) this long after its connection "
        "drops, generating into a bounded buffer, for a ResumeStream to continue it, in "
        "seconds; 0 = resuming off",
        bounds=(0, 3600),
    )

    def check(self) -> None:
        _check(
            self.max_stream_chars >= self.max_text_chars,
            "--max-stream-chars must be >= --max-text-chars",
        )


@dataclass(frozen=True)
class SecurityConfig:
    tls_cert: Path | None = option(
        None, "server certificate chain (PEM); with --tls-key turns on TLS", unset="plaintext"
    )
    tls_key: Path | None = option(None, "server private key (PEM), with --tls-cert", unset="none")
    tls_client_ca: Path | None = option(
        None, "CA bundle for client certificates; turns on mutual TLS", unset="none"
    )
    auth_token_file: Path | None = option(
        None,
        "file of accepted bearer tokens, one a line; turns on token auth (health stays open)",
        unset="none",
    )
    reflection: bool = option(True, "do not serve gRPC server reflection")

    def check(self) -> None:
        _check(
            (self.tls_cert is None) == (self.tls_key is None),
            "--tls-cert and --tls-key must be given together",
        )
        _check(
            self.tls_client_ca is None or self.tls_cert is not None,
            "--tls-client-ca needs --tls-cert/--tls-key",
        )


@dataclass(frozen=True)
class NetworkConfig:
    host: str = option("[::]", "address to listen on")
    port: int = option(
        50051, "gRPC port; 0 picks a free one, printed at start-up", bounds=(0, 65535)
    )
    metrics_port: int = option(0, "Prometheus metrics HTTP port; 0 turns it off", bounds=(0, 65535))
    http_port: int = option(
        0,
        "HTTP port of the OpenAI-compatible /v1/audio/speech, the /v1/audio/speech/stream "
        "WebSocket and the playground page at /, served by the same engine with the same "
        "tokens and TLS as gRPC; 0 turns it off",
        bounds=(0, 65535),
    )
    listen_when_ready: bool = option(
        True,
        "open the gRPC and HTTP ports only once the model is loaded and warm: until then "
        "connections are refused, so no proxy or client sends a call to a replica that would "
        "only refuse it, whatever its health check (Kubernetes: a startupProbe covers the load). "
        "--no-listen-when-ready opens them at start-up, health answering NOT_SERVING while "
        "the model loads: only behind a proxy that checks readiness (deploy/haproxy/haproxy.cfg)",
        switch="both",
    )
    http_idle_s: int = option(
        75,
        "close an idle HTTP keep-alive connection after this long, in seconds: longer than a "
        "proxy keeps its idle connections to a replica (nginx and cloud load balancers: 60 s), "
        "so the replica never closes one while the proxy sends a request on it",
        bounds=(1, 3600),
    )
    keepalive_time_s: float = option(
        30.0, "ping idle connections this often, in seconds", bounds=(1, None)
    )
    keepalive_timeout_s: float = option(
        10.0, "close a connection whose ping is unanswered this long, in seconds", bounds=(1, None)
    )
    max_connection_age_s: float = option(
        0.0,
        "gracefully close connections older than this (load balancers rebalance); 0 = never",
        bounds=(0, None),
    )
    max_connection_age_grace_s: float = option(
        60.0,
        "streams on an aged-out connection get this long to finish, in seconds",
        bounds=(0, None),
    )

    def check(self) -> None:
        _check(
            self.http_port == 0 or self.http_port not in (self.port, self.metrics_port),
            "--http-port must differ from --port and --metrics-port",
        )


@dataclass(frozen=True)
class ServerConfig:
    network: NetworkConfig = field(default_factory=NetworkConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    voices_dir: Path | None = option(
        None,
        "folder of named voice presets (*.json) served by ListVoices",
        unset="none",
        group="model",
    )
    lexicon: tuple[Path, ...] = option(
        (),
        "a W3C PLS 1.0 pronunciation lexicon file read for every stream, which a stream may "
        "also name (its base name without .pls); repeat for several, the later winning for the "
        "same grapheme; SIGHUP reads them again",
        group="model",
    )
    download_only: bool = option(
        False,
        "fetch and check --model into the Hugging Face cache, then exit (an image build, an "
        "init container)",
        group="model",
    )
    log_level: str = option(
        "INFO", "Python logging level", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )

    def check(self) -> None:
        _check(
            self.admission.reserved_slots < self.engine.max_streams,
            "--reserved-slots must be < --max-streams",
        )
        _check(
            not self.download_only or self.model.model is not None, "--download-only needs --model"
        )
        _check(
            not (self.download_only and self.model.dev_model_fallback),
            "--download-only fetches --model or fails: no --dev-model-fallback",
        )
        names = [path.name.removesuffix(".pls") for path in self.lexicon]
        twice = sorted({name for name in names if names.count(name) > 1})
        _check(not twice, f"--lexicon: two files are named {', '.join(twice)}")

    def validate(self) -> ServerConfig:
        """Every field's bounds and choices, then the rules between fields; raises ConfigError."""
        for part in self._sections():
            for f in dataclasses.fields(part):
                if "help" in f.metadata:
                    _check_value(f, getattr(part, f.name))
            check = getattr(part, "check", None)
            if check is not None:
                check()
        return self

    def _sections(self) -> list[Any]:
        # The top level last: its rules between sections assume each section's own bounds.
        return [*(getattr(self, name) for name, _ in SECTIONS), self]


SECTIONS = (
    ("network", "network"),
    ("model", "model"),
    ("engine", "engine"),
    ("admission", "limits and admission"),
    ("limits", "limits and admission"),
    ("security", "security"),
)
"""The sections of `ServerConfig`, in --help order, with their --help group."""
