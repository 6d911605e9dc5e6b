"""Server configuration: one dataclass tree, built once from the command line, passed down.

Each field says everything about itself once, with `option(...)`: its default, its help line,
its choices or bounds. From that `build_parser` makes the command line (`--max-streams` for
`EngineConfig.max_streams`), `config_from_args` maps it back, and `validate` checks every
bound; only rules between fields are written out, in each section's `check`. No module reads
the environment at import time; `main` builds a `ServerConfig` and hands it to whoever needs it.

This module is a leaf: it imports nothing of the server. The defaults it shows that other layers
also use (the chunk schedule, the quantize policy) are defined here and imported from here
(tests/unit/test_import_graph.py holds both rules).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUANTIZE_CHOICES = ("none", "bf16", "int8", "auto")
"""Linear-mode families `--quantize` allows: lossless only, bf16, int8, or any within budget."""
MIN_SNR_DB = 30.0
"""A lossy mode serves under `auto` only if its hidden states are within this SNR of the
lossless mode's (autotune at warm-up; bench/bench_quality.py reports against it)."""

FIRST_CHUNK_TOKENS = 8
"""New tokens in a stream's first audio chunk: small, for a short time to first audio."""
MAX_CHUNK_TOKENS = 32
"""Cap on new tokens per chunk (chunks grow from the first up to it): bounds the per-chunk cost
and the gap between chunks."""
LOOKAHEAD_TOKENS = 8
"""Tokens past a chunk's end that must exist before it is decoded, latency against accuracy:
8 gives >= 60 dB SNR against offline audio in bench/bench_lookahead.py for +171 ms to first
audio."""
BUSY_BATCH = 8
"""Decode batch from which a stream's first chunk is shortened (`BusyFirstChunk`): at
batch 8 and up a CPU decode step costs several times one at batch 1."""
BUSY_FIRST_CHUNK_TOKENS = 4
"""First-chunk tokens of a stream whose first chunk comes at or above BUSY_BATCH."""
BUSY_LOOKAHEAD_TOKENS = 4
"""That first chunk's lookahead (later chunks keep the stream's own)."""
CHUNK_TOKEN_BOUNDS = {
    "first_chunk_tokens": (1, 512),
    "max_chunk_tokens": (1, 1024),
    "lookahead_tokens": (0, 128),
}
"""Inclusive bounds of the chunk schedule, for the server's flags and for one request's
`SynthesisConfig.chunking` alike."""

DEV_MODEL_CACHE = Path("~/.cache/chattts-stream/dev-models")
"""Where dev models are built unless told otherwise; `~` is expanded where it is used, so no
home directory is looked up at import."""


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[Any, ...] | None = None,
    bounds: tuple[float | None, float | None] | None = None,
    unset: str | None = None,
    switch: str | None = None,
    group: str | None = None,
) -> Any:
    """A config field and its command-line flag.

    `bounds`: inclusive (low, high), either may be None. `unset`: what a None default means,
    shown as the default in --help. `switch`: 'on-off' for a bool flag taking on/off (default:
    a bool is a `--name` flag when False by default, `--no-name` when True). `group`: the --help
    group of a top-level field."""
    meta = {"help": help, "choices": choices, "bounds": bounds, "unset": unset, "switch": switch}
    return field(default=default, metadata={**meta, "group": group})


@dataclass(frozen=True)
class ModelConfig:
    model_dir: Path | None = option(
        None, "ChatTTS asset folder in the official layout", unset="none, serve the dev model"
    )
    dev_model: str = option(
        "tiny",
        "random-weight model served without --model-dir; its audio is noise",
        choices=("tiny", "full"),
    )
    dev_model_cache: Path = option(
        DEV_MODEL_CACHE, "where dev models are built once and reused (~ is expanded)"
    )
    allow_unverified: bool = option(
        False, "load model files that do not match ChatTTS's sha256 map"
    )
    device: str = option(
        "auto",
        "where the model runs; auto picks CUDA when available",
        choices=("auto", "cpu", "cuda"),
    )
    dtype: str = option(
        "auto",
        "GPT weight dtype; auto = float16 on CUDA (upstream's half path), float32 on CPU",
        choices=("auto", "float32", "float16", "bfloat16"),
    )
    quantize: str = option(
        "auto",
        "GPT linear layers on CPU (fp32 model): auto = fastest per batch size among modes "
        f"within {MIN_SNR_DB:g} dB hidden-state SNR of fp32; none = fp32 only (exact); "
        "bf16 or int8 weights only",
        choices=QUANTIZE_CHOICES,
    )
    autotune_cache: bool = option(
        True,
        "keep warm-up's linear-mode timing per CPU, thread count, weights and torch version, "
        "and the alignment heads per weights, and reuse them on the next start with the same "
        "key (saves 13-15 s on the full model)",
        switch="on-off",
    )
    autotune_cache_dir: Path | None = option(
        None,
        "folder of the autotune cache (~ is expanded)",
        unset="autotune/ beside --dev-model-cache, ~/.cache/chattts-stream/autotune",
    )

    compile: str = option(
        "off",
        "CPU decode step with each layer torch.compile'd (inductor): off; on = every batch size "
        "(every linear mode); auto = only where it measured faster than "
        "eager at warm-up",
        choices=("off", "auto", "on"),
    )
    compile_budget_s: float = option(
        300.0,
        "seconds warm-up may spend compiling the decode step (checked before each graph; "
        "sizes left over run eagerly); a restart with inductor's cache takes seconds",
        bounds=(0, None),
    )
    compile_cache_dir: Path | None = option(
        None,
        "inductor's cache of compiled kernels and graphs (~ is expanded; "
        "TORCHINDUCTOR_CACHE_DIR wins)",
        unset="inductor/ beside --dev-model-cache",
    )

    def compile_folder(self) -> Path:
        """Where inductor keeps the compiled decode step, so that a restart reuses it."""
        return (self.compile_cache_dir or self.dev_model_cache.parent / "inductor").expanduser()

    def autotune_folder(self) -> Path | None:
        """Where autotune results are kept, or None with --autotune-cache off."""
        if not self.autotune_cache:
            return None
        folder = self.autotune_cache_dir or self.dev_model_cache.parent / "autotune"
        return folder.expanduser()

    threads: int = option(
        0,
        "torch intra-op threads; 0 = CPUs allowed by affinity and cgroup quota",
        bounds=(0, 1024),
    )
    adaptive_threads: bool = option(
        True,
        "on CPU, run fewer intra-op threads while a busy neighbour takes our CPUs, up to "
        "--threads again once they are idle",
        switch="on-off",
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
    busy_batch: int = option(
        BUSY_BATCH,
        "at a decode batch of this many streams, those still before their first chunk get a shorter one "
        "(--busy-first-chunk-tokens, --busy-lookahead-tokens) for a sooner first audio; "
        "0 = off; a request's own chunking fields win",
        bounds=(0, 1024),
    )
    busy_first_chunk_tokens: int = option(
        BUSY_FIRST_CHUNK_TOKENS,
        "that shorter first chunk's tokens (--busy-batch)",
        bounds=CHUNK_TOKEN_BOUNDS["first_chunk_tokens"],
    )
    busy_lookahead_tokens: int = option(
        BUSY_LOOKAHEAD_TOKENS,
        "lookahead of that first chunk (later chunks keep --lookahead-tokens)",
        bounds=CHUNK_TOKEN_BOUNDS["lookahead_tokens"],
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
        _check(
            self.first_chunk_tokens <= self.max_chunk_tokens,
            "--first-chunk-tokens must be <= --max-chunk-tokens",
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
    stall_timeout_s: float = option(
        30.0,
        "cancel a stream, freeing its slot, whose client has taken none of the audio waiting "
        "for it this long, in seconds; 0 = never",
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
        False,
        "open the gRPC and HTTP ports only once the model is loaded and warm (connections are "
        "refused until then), for load balancers that check only that a port accepts TCP; "
        "without it the ports open at start-up and health answers NOT_SERVING while loading",
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
    log_level: str = option(
        "INFO", "Python logging level", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )

    def check(self) -> None:
        _check(
            self.admission.reserved_slots < self.engine.max_streams,
            "--reserved-slots must be < --max-streams",
        )

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


def _flag(f: dataclasses.Field[Any]) -> str:
    name = f.name.replace("_", "-")
    if f.default is True and f.metadata["switch"] is None:
        return f"--no-{name}"
    return f"--{name}"


def _check_value(f: dataclasses.Field[Any], value: Any) -> None:
    choices, bounds = f.metadata["choices"], f.metadata["bounds"]
    if value is None:
        return
    if choices is not None:
        _check(value in choices, f"{_flag(f)} must be one of {', '.join(choices)}, got {value!r}")
    if bounds is not None:
        low, high = bounds
        if high is None:
            _check(value >= low, f"{_flag(f)} must be >= {low:g}")
        else:
            low_text = "-inf" if low is None else f"{low:g}"
            ok = (low is None or value >= low) and value <= high
            _check(ok, f"{_flag(f)} must be in [{low_text}, {high:g}]")


def _add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field[Any], kind: type) -> None:
    m = f.metadata
    help_text = m["help"]
    if kind is bool and m["switch"] is None:
        group.add_argument(_flag(f), action="store_true", help=help_text)
        return
    if kind is bool:  # on-off
        default: Any = "on" if f.default else "off"
        group.add_argument(
            _flag(f),
            choices=["on", "off"],
            default=default,
            help=f"{help_text} (default: %(default)s)",
        )
        return
    shown = f"(default: {m['unset']})" if f.default is None else "(default: %(default)s)"
    group.add_argument(
        _flag(f),
        type=str if kind is Path else kind,
        choices=list(m["choices"]) if m["choices"] else None,
        default=None if f.default is None else str(f.default) if kind is Path else f.default,
        help=f"{help_text} {shown}",
    )


def _kind(annotation: Any) -> type:
    """The scalar type of a field annotation (`int | None` -> int)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation  # type: ignore[no-any-return]


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], type]]:
    hints = typing.get_type_hints(cls)
    return [(f, _kind(hints[f.name])) for f in dataclasses.fields(cls) if "help" in f.metadata]


def build_parser() -> argparse.ArgumentParser:
    """The command line, one flag per `option` field of the config tree."""
    p = argparse.ArgumentParser(
        prog="chattts-server",
        description="Streaming ChatTTS speech synthesis over gRPC (chattts.v1.TextToSpeech).",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    section_types = typing.get_type_hints(ServerConfig)
    top = _fields(ServerConfig)
    for name, title in SECTIONS:
        group = groups.get(title) or groups.setdefault(title, p.add_argument_group(title))
        for f, kind in _fields(section_types[name]):
            _add_flag(group, f, kind)
        for f, kind in top:
            if f.metadata["group"] == name:
                _add_flag(group, f, kind)
    for f, kind in top:
        if f.metadata["group"] is None:
            _add_flag(p, f, kind)  # type: ignore[arg-type]
    return p


def _value(args: argparse.Namespace, f: dataclasses.Field[Any], kind: type) -> Any:
    value = getattr(args, f.name if not _flag(f).startswith("--no-") else f"no_{f.name}")
    if kind is bool:
        if f.metadata["switch"] == "on-off":
            return value == "on"
        return not value if _flag(f).startswith("--no-") else value
    if kind is Path:
        return Path(value) if value else None
    return value


def config_from_args(argv: list[str] | None = None) -> ServerConfig:
    """Parse the command line into a validated `ServerConfig` (raises ConfigError)."""
    args = build_parser().parse_args(argv)
    section_types = typing.get_type_hints(ServerConfig)
    sections = {
        name: section_types[name](
            **{f.name: _value(args, f, k) for f, k in _fields(section_types[name])}
        )
        for name, _ in SECTIONS
    }
    top = {f.name: _value(args, f, k) for f, k in _fields(ServerConfig)}
    return ServerConfig(**sections, **top).validate()
