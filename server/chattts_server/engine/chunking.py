"""How a stream's audio is cut into chunks: the schedule the streaming decoder follows, its one
home. The server builds it once from its flags (`ChunkSchedule.from_config`); a request's own
fields (`ChunkingOptions`) override it per stream (`with_options`).

Plain Python (no torch). The defaults and bounds of the fields a server flag or a request may
set are `config`'s, which the command line shows, and so is the one rule between them
(`config.check_chunk_sizes`). The chunk sizes' growth is written once, in `chunk_tokens`: the
planner (`chunk_plan.py`) and the benchmarks' `schedule` both read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import EngineConfig
from ..defaults import (
    CHUNK_TOKEN_BOUNDS,
    FIRST_CHUNK_TOKENS,
    LOOKAHEAD_TOKENS,
    MAX_CHUNK_TOKENS,
    check_chunk_sizes,
)
from .utterance import ChunkingOptions


@dataclass(frozen=True)
class ChunkSchedule:
    """How a stream is cut into chunks. Token counts are GPT steps (2 mel frames, 512 samples)."""

    # New tokens in a stream's first chunk (config.FIRST_CHUNK_TOKENS says why this many).
    first_chunk_tokens: int = FIRST_CHUNK_TOKENS
    # Each next chunk is this many times the previous one (1 = fixed size), up to the cap.
    growth: float = 2.0
    # Cap on new tokens per chunk (config.MAX_CHUNK_TOKENS).
    max_chunk_tokens: int = MAX_CHUNK_TOKENS
    # Emitted tokens re-decoded as left context; None = the receptive field (exact left seams).
    left_context_tokens: int | None = None
    # Tokens past a chunk's end that must exist before it is decoded (config.LOOKAHEAD_TOKENS).
    lookahead_tokens: int = LOOKAHEAD_TOKENS
    # The first chunk's lookahead where shorter than lookahead_tokens; None = lookahead_tokens.
    # The server's flags set config.FIRST_LOOKAHEAD_TOKENS (`from_config`).
    first_lookahead_tokens: int | None = None
    # Samples crossfaded at each seam when context or lookahead is below the receptive field.
    crossfade_samples: int = 256

    def __post_init__(self) -> None:
        for name, (low, high) in CHUNK_TOKEN_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
        check_chunk_sizes(self.first_chunk_tokens, self.max_chunk_tokens)
        if not 1.0 <= self.growth <= 16.0:
            raise ValueError(f"growth must be in [1, 16], got {self.growth}")
        if not 0 <= self.crossfade_samples <= 48000:
            raise ValueError("crossfade_samples must be in [0, 48000]")

    @classmethod
    def from_config(cls, config: EngineConfig) -> ChunkSchedule:
        """The server's schedule, from its flags."""
        return cls(
            first_chunk_tokens=config.first_chunk_tokens,
            max_chunk_tokens=config.max_chunk_tokens,
            lookahead_tokens=config.lookahead_tokens,
            first_lookahead_tokens=config.first_lookahead_tokens,
        )

    def options(self) -> ChunkingOptions:
        """The fields a request may set, as this schedule has them (`ModelInfo.chunking`)."""
        return ChunkingOptions(
            self.first_chunk_tokens, self.max_chunk_tokens, self.lookahead_tokens
        )

    def lookahead_of(self, chunk_index: int) -> int:
        """Lookahead tokens of a stream's chunk `chunk_index` (0: the first)."""
        if chunk_index == 0 and self.first_lookahead_tokens is not None:
            return min(self.first_lookahead_tokens, self.lookahead_tokens)
        return self.lookahead_tokens

    @property
    def min_lookahead_tokens(self) -> int:
        return self.lookahead_of(0)

    def with_options(self, options: ChunkingOptions) -> ChunkSchedule:
        """This schedule with the options' set fields (server flags or one request) applied;
        a lookahead set there holds for every chunk, the first too."""
        overrides = {k: v for k, v in vars(options).items() if v is not None}
        if not overrides:
            return self
        first_lookahead = self.first_lookahead_tokens
        if options.lookahead_tokens is not None:
            first_lookahead = None
        return replace(self, **overrides, first_lookahead_tokens=first_lookahead)

    def chunk_tokens(self, index: int) -> int:
        """New tokens in a stream's chunk `index` (0: the first) unless the stream's end cuts it
        short: `first_chunk_tokens`, then `growth` times the previous one, up to the cap. Grown
        as a float and rounded per chunk, so a growth of 1.5 gives 8, 12, 18, 27, ..."""
        size, cap = float(self.first_chunk_tokens), float(self.max_chunk_tokens)
        for _ in range(index):
            if size >= cap or self.growth == 1.0:
                break
            size = min(cap, size * self.growth)
        return round(size)

    def schedule(self, num_tokens: int) -> list[int]:
        """New tokens per chunk for a stream of `num_tokens` tokens (for benchmarks and docs)."""
        sizes: list[int] = []
        while sum(sizes) < num_tokens:
            sizes.append(min(self.chunk_tokens(len(sizes)), num_tokens - sum(sizes)))
        return sizes
