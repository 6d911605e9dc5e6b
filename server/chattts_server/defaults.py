"""The defaults and bounds the command line shows that other layers use too: the GPT's quality
budget and the chunk schedule (with the one rule between its fields). A leaf: it imports nothing of the
server, so `config` and the engine and model layers all import these numbers from here."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent."""


GGUF_FORMATS = (
    "F32",
    "F16",
    "Q8_0-mixed4",
    "Q8_0-mixed2",
    "Q8_0-mixed1",
    "Q8_0",
    "Q6_K",
    "Q5_K",
    "Q4_K",
)
"""The GPT's weight formats on llama.cpp, largest first (`--gguf-format`). `Q8_0-mixedN`:
Q8_0 after N layers in F16. A layer's error grows through every later one, so an exact first
layer buys more SNR than any other: on the random-weight dev model Q8_0 gave 29.0 dB against
fp32, Q8_0-mixed1 32.0 dB for 5% more bytes, -mixed2 33.3, -mixed4 35.3 (F16 in the last two
layers instead: 29.0)."""
MIN_SNR_DB = 30.0
"""The quality budget: `--gguf-format auto` serves the smallest format whose hidden states on
the loaded weights are within this SNR of fp32's (bench/bench_quality.py reports each)."""

FIRST_CHUNK_TOKENS = 4
"""New tokens in a stream's first audio chunk (85 ms of audio): small, for a short time to first
audio. Its first audio waits for the prompt's prefill and FIRST_CHUNK_TOKENS +
FIRST_LOOKAHEAD_TOKENS - 1 decode steps (bench/bench_serving.py --parts first-audio)."""
MAX_CHUNK_TOKENS = 32
"""Cap on new tokens per chunk (chunks grow from the first up to it): bounds the per-chunk cost
and the gap between chunks."""
LOOKAHEAD_TOKENS = 8
"""Tokens past a chunk's end that must exist before it is decoded, latency against accuracy:
8 gives >= 60 dB SNR against offline audio in bench/bench_lookahead.py."""
FIRST_LOOKAHEAD_TOKENS = 4
"""The first chunk's lookahead: 4 steps sooner first audio than LOOKAHEAD_TOKENS, for a first
seam decoded with less right context (crossfaded like every short-lookahead seam: 39.5 dB
against offline over the first 16 tokens, 50.4 dB over a 200-token stream; bench_lookahead)."""
CHUNK_TOKEN_BOUNDS = {
    "first_chunk_tokens": (1, 512),
    "max_chunk_tokens": (1, 1024),
    "lookahead_tokens": (0, 128),
    "first_lookahead_tokens": (0, 128),
    "left_context_tokens": (0, 1024),
}
"""Inclusive bounds of the chunk schedule, for the server's flags, one request's
`SynthesisConfig.chunking` and the schedule itself (engine/chunking.py) alike."""


def check_chunk_sizes(first: int, cap: int, name: str = "first_chunk_tokens") -> None:
    """The one rule between the chunk schedule's fields, for the flags, a request's own and the
    schedule itself: the first chunk is no longer than the cap. `name` is the field blamed."""
    if first > cap:
        raise ConfigError(
            f"{name} must leave first_chunk_tokens ({first}) <= max_chunk_tokens ({cap})"
        )
