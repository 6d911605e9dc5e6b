"""Where a stream's chunks fall: `plan_chunks`, a pure function of the schedule, the decode's
geometry and how far the stream has come. Plain Python (no torch), so its rules are tested with
plain numbers (tests/unit/test_chunk_schedule.py).

A chunk covers new tokens [t0, t1), sizes from `ChunkSchedule.chunk_tokens`. It is planned once
`lookahead_tokens` more exist, so its Decoder window reaches tb = t1 + lookahead, and it emits the
samples those tokens' frames determine: the samples from the previous seam to its own seam. A
seam is the span [seam_start, seam_end) crossfaded into the next chunk (empty in exact mode).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..audio_constants import FRAMES_PER_TOKEN
from .chunking import ChunkSchedule


@dataclass(frozen=True)
class ChunkGeometry:
    """What planning needs from the Decoder and the vocoder: sizes and receptive fields."""

    hop_length: int  # samples per mel frame
    end_trim_samples: int  # samples fewer than frames * hop that a vocoder decode returns
    vocoder_left: int  # mel frames before a sample block that the block depends on
    vocoder_right: int  # mel frames after it that a decode must reach for the block to be final
    # (left, right) tokens of context under which streamed output equals offline output.
    receptive_field_tokens: tuple[int, int]

    @property
    def samples_per_token(self) -> int:
        return FRAMES_PER_TOKEN * self.hop_length

    def total_samples(self, num_tokens: int) -> int:
        """Samples an offline decode of `num_tokens` tokens returns (and a stream emits)."""
        frames = FRAMES_PER_TOKEN * num_tokens
        return max(0, frames * self.hop_length - self.end_trim_samples)


@dataclass(frozen=True)
class StreamChunking:
    """How one stream is cut: its schedule, the geometry, and what `resolve` made of them."""

    config: ChunkSchedule
    geometry: ChunkGeometry
    left_context_tokens: int  # emitted tokens re-read as left context by the next chunk
    # Left context and lookahead cover the receptive field: output equals an offline decode.
    exact: bool

    @classmethod
    def resolve(cls, config: ChunkSchedule, geometry: ChunkGeometry) -> StreamChunking:
        """`config` over `geometry`; raises ValueError for a config whose seams could not
        overlap."""
        rf_left, rf_right = geometry.receptive_field_tokens
        left = rf_left if config.left_context_tokens is None else config.left_context_tokens
        exact = left >= rf_left and config.min_lookahead_tokens >= rf_right
        if not exact:
            # The next chunk must start early enough to cover what this one could not produce.
            if left * geometry.samples_per_token < geometry.end_trim_samples:
                raise ValueError("left_context_tokens too small for this vocoder; use at least 1")
            if config.crossfade_samples // 2 + geometry.end_trim_samples > (
                config.first_chunk_tokens * geometry.samples_per_token
            ):
                raise ValueError("crossfade_samples too long for first_chunk_tokens")
        return cls(config, geometry, left, exact)


@dataclass(frozen=True)
class Chunk:
    """One planned chunk of a stream: which tokens, frames and samples it reads and emits."""

    t0: int  # new tokens [t0, t1)
    t1: int
    ta: int  # Decoder window [ta, tb), tokens: left context, new tokens, lookahead
    tb: int
    va: int  # vocoder window [va, vb), mel frames: what the kept samples depend on
    vb: int
    emit_lo: int  # samples [emit_lo, seam_start) are emitted, crossfading the previous tail first
    seam_start: int
    seam_end: int  # samples [seam_start, seam_end) become the tail for the next chunk
    final: bool  # the stream's last chunk


@dataclass(frozen=True)
class PlanPosition:
    """Where a stream's plan stands after the chunks planned so far."""

    next_token: int = 0  # the first token no planned chunk covers
    num_chunks: int = 0  # chunks planned
    # The last seam: samples [start, end) are the tail crossfaded into the next chunk;
    # everything before start has been (or is being) emitted.
    seam: tuple[int, int] = (0, 0)
    final_planned: bool = False  # the chunk ending at the last sample has been planned


def plan_chunks(
    chunking: StreamChunking, position: PlanPosition, num_tokens: int, ended: bool
) -> tuple[list[Chunk], PlanPosition]:
    """The chunks ready once `num_tokens` tokens exist (and the stream `ended` or not), in
    order, and the position after them.

    A chunk is ready when `lookahead_tokens` exist past it, or the stream has ended with tokens
    left (then everything left is planned, in chunks of at most the cap).
    """
    chunks = []
    # After the last token, one more chunk may be needed (with no new tokens) to flush the
    # samples a short lookahead held back.
    while position.next_token < num_tokens or (ended and num_tokens and not position.final_planned):
        chunk = _next_chunk(chunking, position, num_tokens, ended)
        if chunk is None:
            break
        chunks.append(chunk)
        position = PlanPosition(
            chunk.t1, position.num_chunks + 1, (chunk.seam_start, chunk.seam_end), chunk.final
        )
    return chunks, position


def _next_chunk(
    chunking: StreamChunking, position: PlanPosition, total: int, ended: bool
) -> Chunk | None:
    config, geometry = chunking.config, chunking.geometry
    t0 = position.next_token
    t1 = t0 + config.chunk_tokens(position.num_chunks)
    lookahead = config.lookahead_of(position.num_chunks)
    if t1 + lookahead > total:
        if not ended:
            return None
        t1 = min(t1, total)
    ta = max(0, t0 - chunking.left_context_tokens)
    tb = min(total, t1 + lookahead)
    emit_lo = position.seam[0]
    final = ended and t1 == total
    if final:
        seam_start = seam_end = geometry.total_samples(total)
    else:
        seam_start, seam_end = _seam(chunking, position, t1, tb)
    hop = geometry.hop_length
    block_lo, block_hi = emit_lo // hop, -(-seam_end // hop)
    va = max(FRAMES_PER_TOKEN * ta, block_lo - geometry.vocoder_left)
    vb = min(FRAMES_PER_TOKEN * tb, block_hi + geometry.vocoder_right)
    return Chunk(t0, t1, ta, tb, va, vb, emit_lo, seam_start, seam_end, final)


def _seam(chunking: StreamChunking, position: PlanPosition, t1: int, tb: int) -> tuple[int, int]:
    """The samples [start, end) a mid-stream chunk ending at token t1 (window end tb) hands
    to the next chunk as its tail: around the token boundary, within what the window produced,
    after the previous seam, and from where the next chunk's window starts."""
    geometry = chunking.geometry
    crossfade = 0 if chunking.exact else chunking.config.crossfade_samples
    produced_end = geometry.total_samples(tb)
    boundary = geometry.samples_per_token * t1
    seam_end = min(boundary + crossfade // 2, produced_end)
    next_start = geometry.samples_per_token * max(0, t1 - chunking.left_context_tokens)
    seam_start = max(seam_end - crossfade, position.seam[1], next_start)
    assert seam_start <= seam_end, "resolve() rejects configs whose seams cannot overlap"
    return seam_start, seam_end
