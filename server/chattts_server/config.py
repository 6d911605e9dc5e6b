"""Server configuration: one dataclass tree, built once from the command line, passed down.

Every field has a default, a one-line doc and a bound check (`validate`). No module reads the
environment at import time; `main` builds a `ServerConfig` and hands it to whoever needs it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class ModelConfig:
    model_dir: Path | None = None
    """ChatTTS asset folder in the official layout; None means the dev model."""
    dev_model: str = "tiny"
    """Random-weight dev model shapes when no model_dir is given: 'tiny' or 'full'."""
    dev_model_cache: Path = Path.home() / ".cache" / "chattts-stream" / "dev-models"
    """Where dev models are built once and reused."""
    allow_unverified: bool = False
    """Load a model_dir whose files do not match ChatTTS's published sha256 map."""
    device: str = "auto"
    """'auto' (CUDA when available), 'cpu' or 'cuda'."""
    dtype: str = "auto"
    """'auto' (float16 on CUDA, float32 on CPU), 'float32', 'float16' or 'bfloat16'."""
    quantize: str = "none"
    """GPT linear layers on CPU with an fp32 model: 'none' (fp32), 'bf16', 'int8' or 'auto'
    (the fastest per batch size among the modes within the quality budget)."""
    threads: int = 0
    """torch intra-op threads; 0 sizes them from CPU affinity and the cgroup CPU quota."""

    def validate(self) -> None:
        _check(
            self.dev_model in ("tiny", "full"),
            f"--dev-model must be tiny or full, got {self.dev_model!r}",
        )
        _check(
            self.device in ("auto", "cpu", "cuda"),
            f"--device must be auto, cpu or cuda, got {self.device!r}",
        )
        _check(
            self.dtype in ("auto", "float32", "float16", "bfloat16"),
            f"--dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}",
        )
        _check(
            self.quantize in ("none", "bf16", "int8", "auto"),
            f"--quantize must be none, bf16, int8 or auto, got {self.quantize!r}",
        )
        _check(0 <= self.threads <= 1024, "--threads must be in [0, 1024]")


@dataclass(frozen=True)
class EngineConfig:
    max_streams: int = 16
    """Streams generating at once; also the number of KV-cache slots."""
    max_tokens: int = 1536
    """KV-cache positions per slot: prompt plus generated audio tokens of one utterance. The
    default fits the longest piece the text is cut into under max_new_tokens, its prompt and a
    10 s reference voice (text.duration.slot_tokens_needed: 1379 for 768)."""
    max_new_tokens: int = 768
    """Default and ceiling for audio tokens per sentence (about 16 s of speech)."""
    prefill_chunk_tokens: int = 256
    """Long prompts are prefilled in chunks of this many tokens, between decode steps."""
    output_buffer_chunks: int = 8
    """Audio chunks buffered per request before its generation pauses for the reader."""
    warmup: bool = True
    """Run a warm-up generation at start-up, before health reports SERVING."""
    first_chunk_tokens: int | None = None
    """Tokens in the first audio chunk; None keeps the streaming decoder's default (8)."""
    max_chunk_tokens: int | None = None
    """Cap on tokens per audio chunk; None keeps the streaming decoder's default (32)."""
    lookahead_tokens: int | None = None
    """Tokens of lookahead per chunk; None keeps the streaming decoder's default (8)."""
    vocoder: str = "vocos"
    """'vocos' (ChatTTS's own) or 'hifigan' (needs hifigan_checkpoint)."""
    hifigan_checkpoint: Path | None = None
    """HiFi-GAN V1 generator checkpoint for 100-band 24 kHz mel, hop 256."""
    cuda_graphs: bool = True
    """On CUDA, capture the decode step as CUDA graphs at warm-up (one per batch size and
    attention-length bucket); ignored on CPU."""

    def validate(self) -> None:
        _check(1 <= self.max_streams <= 1024, "--max-streams must be in [1, 1024]")
        _check(64 <= self.max_tokens <= 8192, "--max-tokens must be in [64, 8192]")
        _check(
            1 <= self.max_new_tokens < self.max_tokens,
            "--max-new-tokens must be in [1, max_tokens)",
        )
        _check(
            16 <= self.prefill_chunk_tokens <= 4096, "--prefill-chunk-tokens must be in [16, 4096]"
        )
        _check(
            1 <= self.output_buffer_chunks <= 1024, "--output-buffer-chunks must be in [1, 1024]"
        )
        _check(
            self.first_chunk_tokens is None or 1 <= self.first_chunk_tokens <= 512,
            "--first-chunk-tokens must be in [1, 512]",
        )
        _check(
            self.max_chunk_tokens is None or 1 <= self.max_chunk_tokens <= 1024,
            "--max-chunk-tokens must be in [1, 1024]",
        )
        _check(
            self.lookahead_tokens is None or 0 <= self.lookahead_tokens <= 128,
            "--lookahead-tokens must be in [0, 128]",
        )
        _check(self.vocoder in ("vocos", "hifigan"), "--vocoder must be vocos or hifigan")
        _check(
            self.vocoder != "hifigan" or self.hifigan_checkpoint is not None,
            "--vocoder hifigan needs --hifigan-checkpoint",
        )


@dataclass(frozen=True)
class LimitsConfig:
    max_text_chars: int = 4000
    """Characters per text message and per Synthesize request."""
    max_stream_chars: int = 100_000
    """Characters over the whole life of one StreamingSynthesize stream."""
    max_receive_bytes: int = 1 << 20
    """Largest request message accepted; larger ones get RESOURCE_EXHAUSTED."""
    max_send_bytes: int = 8 << 20
    """Largest response message sent."""

    def validate(self) -> None:
        _check(1 <= self.max_text_chars <= 1_000_000, "--max-text-chars must be in [1, 1e6]")
        _check(
            self.max_stream_chars >= self.max_text_chars,
            "--max-stream-chars must be >= --max-text-chars",
        )
        _check(
            1024 <= self.max_receive_bytes <= 1 << 30,
            "--max-receive-bytes must be in [1 KiB, 1 GiB]",
        )
        _check(1024 <= self.max_send_bytes <= 1 << 30, "--max-send-bytes must be in [1 KiB, 1 GiB]")


@dataclass(frozen=True)
class AdmissionConfig:
    max_queue: int = 16
    """Streams that may wait for a free slot; past that, RESOURCE_EXHAUSTED at once."""
    retry_pushback_ms: int = 500
    """Value of grpc-retry-pushback-ms sent with RESOURCE_EXHAUSTED."""
    grace_s: float = 30.0
    """On SIGTERM, streams in flight get this long to finish before they are cancelled."""

    def validate(self) -> None:
        _check(0 <= self.max_queue <= 100_000, "--max-queue must be in [0, 100000]")
        _check(0 <= self.retry_pushback_ms <= 600_000, "--retry-pushback-ms must be in [0, 600000]")
        _check(0 <= self.grace_s <= 3600, "--grace-s must be in [0, 3600]")


@dataclass(frozen=True)
class SecurityConfig:
    tls_cert: Path | None = None
    """Server certificate chain (PEM); with tls_key turns on TLS."""
    tls_key: Path | None = None
    """Server private key (PEM)."""
    tls_client_ca: Path | None = None
    """CA bundle for client certificates; turns on mutual TLS (client certificate required)."""
    auth_token_file: Path | None = None
    """File with accepted bearer tokens, one per line; turns on token auth (health stays open)."""
    reflection: bool = True
    """Serve gRPC server reflection."""

    def validate(self) -> None:
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
    host: str = "[::]"
    """Address to listen on."""
    port: int = 50051
    """gRPC port; 0 picks a free one (printed at start-up)."""
    metrics_port: int = 0
    """Prometheus metrics HTTP port; 0 turns the endpoint off."""
    http_port: int = 0
    """HTTP front door (OpenAI-compatible speech, WebSocket, playground) on the same engine,
    host, tokens and TLS as gRPC; 0 turns it off (`make run` serves it on 8000)."""
    keepalive_time_s: float = 30.0
    """Server pings idle connections this often."""
    keepalive_timeout_s: float = 10.0
    """A ping unanswered this long closes the connection."""
    max_connection_age_s: float = 0.0
    """Connections older than this are gracefully closed (lets load balancers rebalance); 0 = never."""
    max_connection_age_grace_s: float = 60.0
    """Streams on an aged-out connection get this long to finish."""

    def validate(self) -> None:
        _check(0 <= self.port <= 65535, "--port must be in [0, 65535]")
        _check(0 <= self.metrics_port <= 65535, "--metrics-port must be in [0, 65535]")
        _check(0 <= self.http_port <= 65535, "--http-port must be in [0, 65535]")
        _check(
            self.http_port == 0 or self.http_port not in (self.port, self.metrics_port),
            "--http-port must differ from --port and --metrics-port",
        )
        _check(self.keepalive_time_s >= 1, "--keepalive-time-s must be >= 1")
        _check(self.keepalive_timeout_s >= 1, "--keepalive-timeout-s must be >= 1")
        _check(self.max_connection_age_s >= 0, "--max-connection-age-s must be >= 0")
        _check(self.max_connection_age_grace_s >= 0, "--max-connection-age-grace-s must be >= 0")


@dataclass(frozen=True)
class ServerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    voices_dir: Path | None = None
    """Folder of named voice presets (*.json), served by ListVoices."""
    log_level: str = "INFO"
    """Python logging level."""

    def validate(self) -> ServerConfig:
        for part in (
            self.model,
            self.engine,
            self.limits,
            self.admission,
            self.security,
            self.network,
        ):
            part.validate()
        _check(
            self.log_level in ("DEBUG", "INFO", "WARNING", "ERROR"), "--log-level is not a level"
        )
        return self


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def build_parser() -> argparse.ArgumentParser:
    d = ServerConfig()
    p = argparse.ArgumentParser(
        prog="chattts-server",
        description="Streaming ChatTTS speech synthesis over gRPC (chattts.v1.TextToSpeech).",
    )
    g = p.add_argument_group("network")
    g.add_argument(
        "--host", default=d.network.host, help="address to listen on (default: %(default)s)"
    )
    g.add_argument(
        "--port",
        type=int,
        default=d.network.port,
        help="gRPC port; 0 picks a free one, printed at start-up (default: %(default)s)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=d.network.metrics_port,
        help="Prometheus metrics HTTP port; 0 turns it off (default: %(default)s)",
    )
    g.add_argument(
        "--http-port",
        type=int,
        default=d.network.http_port,
        help="HTTP port of the OpenAI-compatible /v1/audio/speech, the /v1/audio/speech/stream "
        "WebSocket and the playground page at /, served by the same engine with the same "
        "tokens and TLS as gRPC; 0 turns it off (default: %(default)s)",
    )
    g.add_argument(
        "--keepalive-time-s",
        type=float,
        default=d.network.keepalive_time_s,
        help="ping idle connections this often, in seconds (default: %(default)s)",
    )
    g.add_argument(
        "--keepalive-timeout-s",
        type=float,
        default=d.network.keepalive_timeout_s,
        help="close a connection whose ping is unanswered this long, in seconds (default: %(default)s)",
    )
    g.add_argument(
        "--max-connection-age-s",
        type=float,
        default=d.network.max_connection_age_s,
        help="gracefully close connections older than this (load balancers rebalance); 0 = never (default: %(default)s)",
    )
    g.add_argument(
        "--max-connection-age-grace-s",
        type=float,
        default=d.network.max_connection_age_grace_s,
        help="streams on an aged-out connection get this long to finish, in seconds (default: %(default)s)",
    )

    g = p.add_argument_group("model")
    g.add_argument(
        "--model-dir",
        help="ChatTTS asset folder in the official layout (default: none, serve the dev model)",
    )
    g.add_argument(
        "--dev-model",
        choices=["tiny", "full"],
        default=d.model.dev_model,
        help="random-weight model served without --model-dir; its audio is noise (default: %(default)s)",
    )
    g.add_argument(
        "--dev-model-cache",
        default=str(d.model.dev_model_cache),
        help="where dev models are built once and reused (default: %(default)s)",
    )
    g.add_argument(
        "--allow-unverified",
        action="store_true",
        help="load model files that do not match ChatTTS's sha256 map",
    )
    g.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default=d.model.device,
        help="where the model runs; auto picks CUDA when available (default: %(default)s)",
    )
    g.add_argument(
        "--dtype",
        choices=["auto", "float32", "float16", "bfloat16"],
        default=d.model.dtype,
        help="GPT weight dtype; auto = float16 on CUDA (upstream's half path), float32 on CPU (default: %(default)s)",
    )
    g.add_argument(
        "--quantize",
        choices=["none", "bf16", "int8", "auto"],
        default=d.model.quantize,
        help="GPT linear layers on CPU (fp32 model): none = fp32; bf16 and int8 weights; auto = "
        "fastest per batch size among modes within 30 dB hidden-state SNR (default: %(default)s)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=d.model.threads,
        help="torch intra-op threads; 0 = CPUs allowed by affinity and cgroup quota "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--voices-dir",
        help="folder of named voice presets (*.json) served by ListVoices (default: none)",
    )

    g = p.add_argument_group("engine")
    g.add_argument(
        "--max-streams",
        type=int,
        default=d.engine.max_streams,
        help="streams generating at once; also the number of KV-cache slots (default: %(default)s)",
    )
    g.add_argument(
        "--max-tokens",
        type=int,
        default=d.engine.max_tokens,
        help="KV-cache positions per slot: prompt plus audio tokens of one sentence (default: %(default)s)",
    )
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.engine.max_new_tokens,
        help="default and ceiling of audio tokens per sentence, 47 a second of speech (default: %(default)s)",
    )
    g.add_argument(
        "--prefill-chunk-tokens",
        type=int,
        default=d.engine.prefill_chunk_tokens,
        help="prefill long prompts this many tokens at a time, between decode steps (default: %(default)s)",
    )
    g.add_argument(
        "--output-buffer-chunks",
        type=int,
        default=d.engine.output_buffer_chunks,
        help="audio chunks buffered per stream before it waits for its reader (default: %(default)s)",
    )
    g.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up generation")
    g.add_argument(
        "--first-chunk-tokens",
        type=int,
        default=d.engine.first_chunk_tokens,
        help="tokens in the first audio chunk (default: the streaming decoder's 8)",
    )
    g.add_argument(
        "--max-chunk-tokens",
        type=int,
        default=d.engine.max_chunk_tokens,
        help="cap on tokens per audio chunk (default: the streaming decoder's 32)",
    )
    g.add_argument(
        "--lookahead-tokens",
        type=int,
        default=d.engine.lookahead_tokens,
        help="tokens of lookahead per chunk (default: the streaming decoder's 8)",
    )
    g.add_argument(
        "--vocoder",
        choices=["vocos", "hifigan"],
        default=d.engine.vocoder,
        help="mel-to-audio vocoder: ChatTTS's Vocos, or HiFi-GAN from a checkpoint (default: %(default)s)",
    )
    g.add_argument(
        "--hifigan-checkpoint",
        help="HiFi-GAN V1 generator (100-band 24 kHz mel, hop 256) for --vocoder hifigan (default: none)",
    )
    g.add_argument(
        "--cuda-graphs",
        choices=["on", "off"],
        default="on" if d.engine.cuda_graphs else "off",
        help="capture the decode step as CUDA graphs at warm-up; CUDA only (default: %(default)s)",
    )

    g = p.add_argument_group("limits and admission")
    g.add_argument(
        "--max-queue",
        type=int,
        default=d.admission.max_queue,
        help="streams that may wait for a slot; beyond, RESOURCE_EXHAUSTED at once (default: %(default)s)",
    )
    g.add_argument(
        "--retry-pushback-ms",
        type=int,
        default=d.admission.retry_pushback_ms,
        help="grpc-retry-pushback-ms sent with RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    g.add_argument(
        "--grace-s",
        type=float,
        default=d.admission.grace_s,
        help="on SIGTERM, streams in flight get this long to finish, in seconds (default: %(default)s)",
    )
    g.add_argument(
        "--max-text-chars",
        type=int,
        default=d.limits.max_text_chars,
        help="characters per text message and per Synthesize request (default: %(default)s)",
    )
    g.add_argument(
        "--max-stream-chars",
        type=int,
        default=d.limits.max_stream_chars,
        help="characters over the whole life of one StreamingSynthesize stream (default: %(default)s)",
    )
    g.add_argument(
        "--max-receive-bytes",
        type=int,
        default=d.limits.max_receive_bytes,
        help="largest request message accepted; larger get RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    g.add_argument(
        "--max-send-bytes",
        type=int,
        default=d.limits.max_send_bytes,
        help="largest response message sent (default: %(default)s)",
    )

    g = p.add_argument_group("security")
    g.add_argument(
        "--tls-cert",
        help="server certificate chain (PEM); with --tls-key turns on TLS (default: plaintext)",
    )
    g.add_argument("--tls-key", help="server private key (PEM), with --tls-cert (default: none)")
    g.add_argument(
        "--tls-client-ca",
        help="CA bundle for client certificates; turns on mutual TLS (default: none)",
    )
    g.add_argument(
        "--auth-token-file",
        help="file of accepted bearer tokens, one a line; turns on token auth (default: none)",
    )
    g.add_argument(
        "--no-reflection", action="store_true", help="do not serve gRPC server reflection"
    )

    p.add_argument(
        "--log-level",
        default=d.log_level,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Python logging level (default: %(default)s)",
    )
    return p


def config_from_args(argv: list[str] | None = None) -> ServerConfig:
    """Parse the command line into a validated `ServerConfig` (raises ConfigError)."""
    a = build_parser().parse_args(argv)
    cfg = ServerConfig(
        model=ModelConfig(
            model_dir=_path(a.model_dir),
            dev_model=a.dev_model,
            dev_model_cache=Path(a.dev_model_cache),
            allow_unverified=a.allow_unverified,
            device=a.device,
            dtype=a.dtype,
            quantize=a.quantize,
            threads=a.threads,
        ),
        engine=EngineConfig(
            max_streams=a.max_streams,
            max_tokens=a.max_tokens,
            max_new_tokens=a.max_new_tokens,
            prefill_chunk_tokens=a.prefill_chunk_tokens,
            output_buffer_chunks=a.output_buffer_chunks,
            warmup=not a.no_warmup,
            first_chunk_tokens=a.first_chunk_tokens,
            max_chunk_tokens=a.max_chunk_tokens,
            lookahead_tokens=a.lookahead_tokens,
            vocoder=a.vocoder,
            hifigan_checkpoint=_path(a.hifigan_checkpoint),
            cuda_graphs=a.cuda_graphs == "on",
        ),
        limits=LimitsConfig(
            max_text_chars=a.max_text_chars,
            max_stream_chars=a.max_stream_chars,
            max_receive_bytes=a.max_receive_bytes,
            max_send_bytes=a.max_send_bytes,
        ),
        admission=AdmissionConfig(
            max_queue=a.max_queue, retry_pushback_ms=a.retry_pushback_ms, grace_s=a.grace_s
        ),
        security=SecurityConfig(
            tls_cert=_path(a.tls_cert),
            tls_key=_path(a.tls_key),
            tls_client_ca=_path(a.tls_client_ca),
            auth_token_file=_path(a.auth_token_file),
            reflection=not a.no_reflection,
        ),
        network=NetworkConfig(
            host=a.host,
            port=a.port,
            metrics_port=a.metrics_port,
            http_port=a.http_port,
            keepalive_time_s=a.keepalive_time_s,
            keepalive_timeout_s=a.keepalive_timeout_s,
            max_connection_age_s=a.max_connection_age_s,
            max_connection_age_grace_s=a.max_connection_age_grace_s,
        ),
        voices_dir=_path(a.voices_dir),
        log_level=a.log_level,
    )
    return cfg.validate()
