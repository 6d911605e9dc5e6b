"""What every streaming decode path shares: a stream's hidden states in, its chunk plan, and its
PCM out through crossfaded seams (`ChunkedStream`), and the decoder whose step runs them
(`ChunkedDecoder`; each path fills in how a batch of chunks is decoded).

A chunk covers new tokens [t0, t1), sizes from `ChunkSchedule` (`ChunkSizes`). It is planned once
`lookahead_tokens` more exist, so its Decoder window reaches tb = t1 + lookahead, and it emits the
samples those tokens' frames determine: the samples from the previous seam to its own seam. A
seam is the span [seam_start, seam_end) crossfaded into the next chunk (empty in exact mode). How
the chunk's samples are computed is the decoder's business (`streaming_decode.py`, and the
window-path oracle in `chattts_devtools/window_decoder.py`); the plan and the seams are the same.

Runs on the engine thread only; nothing here locks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from ..model.mel_decoder import decoder_receptive_field
from ..model.receptive_field import (
    FRAMES_PER_TOKEN,
    ReceptiveField,
    combined_receptive_field_tokens,
)
from ..model.vocoders import Vocoder, right_frames_needed
from .chunking import ChunkSchedule, ChunkSizes


@dataclass(frozen=True)
class ChunkGeometry:
    """What planning needs from the Decoder and the vocoder: sizes and receptive fields."""

    hop_length: int  # samples per mel frame
    end_trim_samples: int  # samples fewer than frames * hop that a vocoder decode returns
    vocoder_left: int  # mel frames before a sample block that the block depends on
    vocoder_right: int  # mel frames after it that a decode must reach for the block to be final
    # (left, right) tokens of context under which streamed output equals offline output.
    receptive_field_tokens: ReceptiveField

    @classmethod
    def of(cls, decoder_receptive_field: ReceptiveField, vocoder: Vocoder) -> ChunkGeometry:
        return cls(
            hop_length=vocoder.hop_length,
            end_trim_samples=vocoder.end_trim_samples,
            vocoder_left=vocoder.receptive_field[0],
            vocoder_right=right_frames_needed(vocoder),
            receptive_field_tokens=combined_receptive_field_tokens(
                decoder_receptive_field, vocoder.receptive_field
            ),
        )

    @property
    def samples_per_token(self) -> int:
        return FRAMES_PER_TOKEN * self.hop_length

    def total_samples(self, num_tokens: int) -> int:
        """Samples an offline decode of `num_tokens` tokens returns (and a stream emits)."""
        frames = FRAMES_PER_TOKEN * num_tokens
        return max(0, frames * self.hop_length - self.end_trim_samples)

    def resolve(self, config: ChunkSchedule) -> tuple[int, bool]:
        """(left context tokens, exact) for a stream under `config`; raises ValueError for a
        config whose seams could not overlap."""
        rf_left, rf_right = self.receptive_field_tokens
        left = rf_left if config.left_context_tokens is None else config.left_context_tokens
        exact = left >= rf_left and config.min_lookahead_tokens >= rf_right
        if not exact:
            # The next chunk must start early enough to cover what this one could not produce.
            if left * self.samples_per_token < self.end_trim_samples:
                raise ValueError("left_context_tokens too small for this vocoder; use at least 1")
            if config.crossfade_samples // 2 + self.end_trim_samples > (
                config.first_chunk_tokens * self.samples_per_token
            ):
                raise ValueError("crossfade_samples too long for first_chunk_tokens")
        return left, exact


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


def _fade_in(n: int) -> np.ndarray:
    # Raised cosine: fade_in + fade_out == 1 at every sample.
    return (np.sin(0.5 * np.pi * (np.arange(n) + 0.5) / n) ** 2).astype(np.float32)


class ChunkedStream:
    """One utterance: pushed hidden states, the chunks planned over them, the seam tail.

    Subclasses add what their decode path keeps between chunks and say which hidden states it
    still needs (`_first_token_needed`); every state change happens in a method here or there.
    """

    def __init__(
        self, config: ChunkSchedule, geometry: ChunkGeometry, left_context_tokens: int, exact: bool
    ) -> None:
        self.config = config
        self.geometry = geometry
        self.left_context_tokens = left_context_tokens
        # Left context and lookahead cover the receptive field: output equals an offline decode.
        self.exact = exact
        self._buf: Tensor | None = None  # (capacity, D) hidden states, row 0 is token _buf_start
        self._buf_start = 0
        self._num_tokens = 0  # tokens pushed so far
        self._ended = False
        self._sizes = ChunkSizes(config)
        self._next_token = 0  # first token not yet covered by a chunk
        self._final_planned = False  # the chunk ending at the last sample has been planned
        # Last planned seam: samples [start, end) are the tail crossfaded into the next chunk;
        # everything before start has been (or is being) emitted.
        self._seam = (0, 0)
        self._tail = np.zeros(0, dtype=np.float32)  # samples [_emitted, _emitted + len)
        self._emitted = 0  # samples returned so far
        # Cost counters, per chunk (windows never grow with position).
        self.num_chunks = 0
        # Tokens the Decoder read for the last chunk: its window, or (stateful) the new tokens.
        self.last_window_tokens = 0
        self.max_window_tokens = 0
        self.last_vocoder_frames = 0  # mel frames the vocoder read for the last chunk

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def done(self) -> bool:
        """Input ended and every sample emitted."""
        return self._ended and (self._num_tokens == 0 or self._final_planned)

    @property
    def next_token(self) -> int:
        """The first token no planned chunk covers yet."""
        return self._next_token

    @property
    def buffered_tokens(self) -> int:
        """Rows of hidden states held (left context plus not yet decoded tokens)."""
        return 0 if self._buf is None else self._num_tokens - self._buf_start

    # -- hidden states in --------------------------------------------------------------------

    def push(self, hidden: Tensor) -> None:
        """Append hidden states (n, D) in generation order."""
        if self._ended:
            raise RuntimeError("push after end of stream")
        if hidden.dim() != 2:
            raise ValueError(f"expected (n, D) hidden states, got shape {tuple(hidden.shape)}")
        n = hidden.shape[0]
        if self._buf is None:
            capacity = max(64, 2 * n)
            self._buf = hidden.new_empty((capacity, hidden.shape[1]))
        used = self._num_tokens - self._buf_start
        if used + n > self._buf.shape[0]:
            self._compact()
            used = self._num_tokens - self._buf_start
            if used + n > self._buf.shape[0]:
                grown = self._buf.new_empty(
                    (max(2 * self._buf.shape[0], used + n), self._buf.shape[1])
                )
                grown[:used] = self._buf[:used]
                self._buf = grown
        self._buf[used : used + n] = hidden.to(device=self._buf.device, dtype=self._buf.dtype)
        self._num_tokens += n

    def end(self) -> None:
        """No more hidden states: the tail is decoded without lookahead at the next step."""
        self._ended = True

    def _first_token_needed(self) -> int:
        """The first token a later chunk will read (the decode path's choice)."""
        raise NotImplementedError

    def _compact(self) -> None:
        # Drop tokens no chunk will read again.
        assert self._buf is not None
        keep_from = max(self._buf_start, self._first_token_needed())
        drop = keep_from - self._buf_start
        if drop > 0:
            used = self._num_tokens - keep_from
            self._buf[:used] = self._buf[drop : drop + used].clone()
            self._buf_start = keep_from

    def _hidden(self, ta: int, tb: int) -> Tensor:
        """Hidden states of tokens [ta, tb), a view of the buffer."""
        assert self._buf is not None
        return self._buf[ta - self._buf_start : tb - self._buf_start]

    # -- the chunk plan ----------------------------------------------------------------------

    def plan(self) -> list[Chunk]:
        """The chunks now ready, in order, each counted as planned.

        A chunk is ready when `lookahead_tokens` exist past it, or the stream has ended with
        tokens left (then everything left is planned, in chunks of at most the cap).
        """
        chunks = []
        # After the last token, one more chunk may be needed (with no new tokens) to flush the
        # samples a short lookahead held back.
        while self._next_token < self._num_tokens or (
            self._ended and self._num_tokens and not self._final_planned
        ):
            chunk = self._next_chunk()
            if chunk is None:
                break
            chunks.append(chunk)
            self._next_token = chunk.t1
            self._seam = (chunk.seam_start, chunk.seam_end)
            self._final_planned = chunk.final
            self._sizes.advance()
            self.num_chunks += 1
            self.last_vocoder_frames = chunk.vb - chunk.va
        return chunks

    def _next_chunk(self) -> Chunk | None:
        config, geometry, total = self.config, self.geometry, self._num_tokens
        hop = geometry.hop_length
        t0 = self._next_token
        t1 = t0 + self._sizes.next_tokens
        lookahead = config.lookahead_of(self.num_chunks)
        if t1 + lookahead > total:
            if not self._ended:
                return None
            t1 = min(t1, total)
        ta = max(0, t0 - self.left_context_tokens)
        tb = min(total, t1 + lookahead)
        emit_lo = self._seam[0]
        final = self._ended and t1 == total
        if final:
            seam_start = seam_end = geometry.total_samples(total)
        else:
            crossfade = 0 if self.exact else config.crossfade_samples
            produced_end = geometry.total_samples(tb)
            boundary = geometry.samples_per_token * t1
            seam_end = min(boundary + crossfade // 2, produced_end)
            next_start = geometry.samples_per_token * max(0, t1 - self.left_context_tokens)
            seam_start = max(seam_end - crossfade, self._seam[1], next_start)
            assert seam_start <= seam_end, "resolve() rejects configs whose seams cannot overlap"
        block_lo, block_hi = emit_lo // hop, -(-seam_end // hop)
        va = max(FRAMES_PER_TOKEN * ta, block_lo - geometry.vocoder_left)
        vb = min(FRAMES_PER_TOKEN * tb, block_hi + geometry.vocoder_right)
        return Chunk(t0, t1, ta, tb, va, vb, emit_lo, seam_start, seam_end, final)

    # -- PCM out -----------------------------------------------------------------------------

    def emit(self, chunk: Chunk, audio: np.ndarray, origin: int) -> np.ndarray:
        """The samples `chunk` adds to the stream, given its decoded `audio` (the stream's
        samples from `origin` on): the previous tail crossfaded in, up to this chunk's seam,
        whose span is kept as the next tail. Chunks of a stream are emitted in plan order."""
        assert origin <= chunk.emit_lo == self._emitted
        assert origin + len(audio) >= chunk.seam_end

        def span(lo: int, hi: int) -> np.ndarray:
            return audio[lo - origin : hi - origin]

        parts = []
        pos = chunk.emit_lo
        num_fade = len(self._tail)
        if num_fade:
            fade_in = _fade_in(num_fade)
            parts.append(self._tail * (1.0 - fade_in) + span(pos, pos + num_fade) * fade_in)
            pos += num_fade
        parts.append(span(pos, chunk.seam_start))
        self._tail = span(chunk.seam_start, chunk.seam_end).copy()
        self._emitted = chunk.seam_start
        return np.concatenate(parts).astype(np.float32, copy=False)

    def trim(self) -> None:
        """After a step: drop what no later chunk reads, or everything once done."""
        if self.done:
            self._release()
        elif self._buf is not None:
            self._compact()
            self._trim_held()

    def _release(self) -> None:
        self._buf = None

    def _trim_held(self) -> None:
        """Drop what the decode path holds beyond hidden states and no later chunk reads."""


K = TypeVar("K")
"""A stream's key in a decode step (the runner uses slot ids)."""

S = TypeVar("S", bound=ChunkedStream)


class ChunkedDecoder(Generic[S]):
    """Chunked Decoder+vocoder over many streams: each step plans every stream's ready chunks,
    decodes them all in one batch (`_decode`, the subclass's path) and emits them through the
    seams. Subclasses: `StreamingDecoder` (stateful, production) and the window path that tests
    and benchmarks hold it against (`chattts_devtools/window_decoder.py`)."""

    def __init__(
        self,
        decoder: nn.Module,
        vocoder: Vocoder,
        config: ChunkSchedule | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        param = next(decoder.parameters())
        self.decoder = decoder
        self.vocoder = vocoder
        self.default_config = config or ChunkSchedule()
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = param.dtype
        self.decoder_receptive_field: ReceptiveField = decoder_receptive_field(decoder)
        self.geometry = ChunkGeometry.of(self.decoder_receptive_field, vocoder)
        # (left, right) tokens of context under which streamed output equals offline output.
        self.receptive_field_tokens: ReceptiveField = self.geometry.receptive_field_tokens
        self.hop_length = vocoder.hop_length
        self.num_decoder_calls = 0
        self.num_vocoder_calls = 0  # forward passes, however many streams each batched

    def open(self, config: ChunkSchedule | None = None) -> S:
        """A new stream under `config` (the default config if None)."""
        config = config or self.default_config
        left, exact = self.geometry.resolve(config)
        return self._new_stream(config, left, exact)

    def _new_stream(self, config: ChunkSchedule, left: int, exact: bool) -> S:
        raise NotImplementedError

    def total_samples(self, num_tokens: int) -> int:
        """Samples an offline decode of `num_tokens` tokens returns (and a stream emits)."""
        return self.geometry.total_samples(num_tokens)

    def step(self, streams: Mapping[K, S]) -> dict[K, np.ndarray]:
        """Decode every ready chunk of `streams` (batched, by any key: the runner's slot ids);
        PCM for each stream that had one, under its key.

        A stream is ready when `lookahead_tokens` exist past its next chunk, or it has ended
        with tokens left (then everything left is decoded, in chunks of at most the cap).
        """
        planned = [
            (key, stream, chunk) for key, stream in streams.items() for chunk in stream.plan()
        ]
        out: dict[K, list[np.ndarray]] = {}
        if planned:
            with torch.inference_mode():
                decoded = self._decode([(stream, chunk) for _, stream, chunk in planned])
            # Per stream in plan order: each seam needs the previous chunk's tail.
            for (key, stream, chunk), (audio, origin) in zip(planned, decoded, strict=True):
                out.setdefault(key, []).append(stream.emit(chunk, audio, origin))
        for stream in streams.values():
            stream.trim()
        return {key: np.concatenate(parts) for key, parts in out.items()}

    def finish(self, streams: Mapping[K, S]) -> dict[K, np.ndarray]:
        """End `streams` and flush them: one entry per key (empty PCM if nothing was left)."""
        for stream in streams.values():
            stream.end()
        flushed = self.step(streams)
        empty = np.zeros(0, dtype=np.float32)
        return {key: flushed.get(key, empty) for key in streams}

    def _decode(self, planned: list[tuple[S, Chunk]]) -> list[tuple[np.ndarray, int]]:
        """Decode the planned (stream, chunk) pairs in one batch: per pair, its samples and
        the stream's index of the first one."""
        raise NotImplementedError
