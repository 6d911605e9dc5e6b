"""How a stream's audio is cut into chunks: the schedule the streaming decoder follows, its one
home. The server builds it once from its flags (`ChunkSchedule.from_config`); a request's own
fields (`ChunkingOptions`) override it per stream (`with_options`).

Plain Python (no torch). The defaults and bounds of the fields a server flag or a request may
set are `config`'s, which the command line shows, and so is the one rule between them
(`config.check_chunk_sizes`). The chunk sizes' growth is written once, in `ChunkSizes`: the
decoder's planning and the benchmarks' `schedule` both read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import EngineConfig
from ..defaults import (
    BUSY_BATCH,
    BUSY_FIRST_CHUNK_TOKENS,
    BUSY_LOOKAHEAD_TOKENS,
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
    # The first chunk's lookahead, when shorter (`BusyFirstChunk`); None = lookahead_tokens.
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
        if self.first_lookahead_tokens is not None and not (
            0 <= self.first_lookahead_tokens <= self.lookahead_tokens
        ):
            raise ValueError("first_lookahead_tokens must be in [0, lookahead_tokens] or None")
        if not 0 <= self.crossfade_samples <= 48000:
            raise ValueError("crossfade_samples must be in [0, 48000]")

    @classmethod
    def from_config(cls, config: EngineConfig) -> ChunkSchedule:
        """The server's schedule, from its flags."""
        return cls(
            first_chunk_tokens=config.first_chunk_tokens,
            max_chunk_tokens=config.max_chunk_tokens,
            lookahead_tokens=config.lookahead_tokens,
        )

    def options(self) -> ChunkingOptions:
        """The fields a request may set, as this schedule has them (`ModelInfo.chunking`)."""
        return ChunkingOptions(
            self.first_chunk_tokens, self.max_chunk_tokens, self.lookahead_tokens
        )

    def lookahead_of(self, chunk_index: int) -> int:
        """Lookahead tokens of a stream's chunk `chunk_index` (0: the first)."""
        if chunk_index == 0 and self.first_lookahead_tokens is not None:
            return self.first_lookahead_tokens
        return self.lookahead_tokens

    @property
    def min_lookahead_tokens(self) -> int:
        return self.lookahead_of(0)

    def with_options(self, options: ChunkingOptions) -> ChunkSchedule:
        """This schedule with the options' set fields (server flags or one request) applied."""
        overrides = {k: v for k, v in vars(options).items() if v is not None}
        return replace(self, **overrides) if overrides else self

    def schedule(self, num_tokens: int) -> list[int]:
        """New tokens per chunk for a stream of `num_tokens` tokens (for benchmarks and docs)."""
        sizes, cursor, done = [], ChunkSizes(self), 0
        while done < num_tokens:
            size = min(cursor.next_tokens, num_tokens - done)
            sizes.append(size)
            done += size
            cursor.advance()
        return sizes


class ChunkSizes:
    """A stream's chunk sizes in order: `first_chunk_tokens`, then `growth` times the previous
    one, up to `max_chunk_tokens`. A cursor, so a planner can read the next size and advance
    only once the chunk is planned."""

    def __init__(self, config: ChunkSchedule) -> None:
        self._config = config
        # Grown as a float and rounded per chunk, so a growth of 1.5 gives 8, 12, 18, 27, ...
        self._size = float(config.first_chunk_tokens)

    @property
    def next_tokens(self) -> int:
        """New tokens in the next chunk (before a stream's end cuts it short)."""
        return round(self._size)

    def advance(self) -> None:
        self._size = min(float(self._config.max_chunk_tokens), self._size * self._config.growth)


@dataclass(frozen=True)
class BusyFirstChunk:
    """A shorter first chunk, and a shorter lookahead for it, for a stream whose first chunk
    is still to come while the decode batch is large (decided every step, so a
    stream that started alone and was joined by a burst shortens too).

    Time to first audio is the prompt's prefill plus first_chunk_tokens + lookahead_tokens
    GPT steps, and a step at batch 16 costs several times one at batch 1 on a CPU (memory
    reads are shared; attention, norms and sampling are not). Halving those steps under load
    halves that part of the wait. The cost is one more chunk per stream (sizes 4, 8, 16, 32
    instead of 8, 16, 32) and a first seam decoded with less right context, crossfaded like
    every short-lookahead seam (bench/bench_lookahead.py, its busy row). Later chunks keep
    the stream's own lookahead. A request that sets its own first chunk or lookahead keeps
    it (`shorten`'s `fixed`). The scheduler decides which streams (`applies`, each step); the
    runner shortens their schedules (`shorten`).
    """

    min_batch: int = BUSY_BATCH
    """Decode batch (rows a step samples) from which a stream that has decoded no chunk yet
    takes the shorter first chunk; 0 = never."""
    first_chunk_tokens: int = BUSY_FIRST_CHUNK_TOKENS
    lookahead_tokens: int = BUSY_LOOKAHEAD_TOKENS

    @classmethod
    def from_config(cls, config: EngineConfig) -> BusyFirstChunk:
        return cls(config.busy_batch, config.busy_first_chunk_tokens, config.busy_lookahead_tokens)

    def applies(self, batch: int) -> bool:
        return 0 < self.min_batch <= batch

    def apply(
        self, config: ChunkSchedule, batch: int, fixed: ChunkingOptions | None = None
    ) -> ChunkSchedule:
        """`config` for a stream not yet decoded, at decode batch `batch`."""
        return self.shorten(config, fixed) if self.applies(batch) else config

    def shorten(self, config: ChunkSchedule, fixed: ChunkingOptions | None = None) -> ChunkSchedule:
        """`config` with the shorter first chunk: shortened only where it is longer than this
        policy's sizes and `fixed` (one request's options) left it unset."""
        fixed = fixed or ChunkingOptions()
        changes: dict[str, int] = {}
        if fixed.first_chunk_tokens is None:
            changes["first_chunk_tokens"] = min(config.first_chunk_tokens, self.first_chunk_tokens)
        if fixed.lookahead_tokens is None and self.lookahead_tokens < config.lookahead_tokens:
            changes["first_lookahead_tokens"] = self.lookahead_tokens
        return replace(config, **changes) if changes else config
