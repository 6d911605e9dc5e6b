"""A stream's PCM out: each chunk's samples joined to the last one's across the seam between
them, with a raised-cosine (Hann) crossfade whose gains sum to one. Both sides approximate the
same signal, so they are correlated and an equal-gain fade keeps the level, where an
equal-power fade would bump it by up to 3 dB."""

from __future__ import annotations

import numpy as np

from .chunk_plan import Chunk


def fade_in(n: int) -> np.ndarray:
    """Gains of the incoming side over `n` samples; the outgoing side's are 1 - these."""
    return (np.sin(0.5 * np.pi * (np.arange(n) + 0.5) / n) ** 2).astype(np.float32)


class SeamJoiner:
    """The samples a stream has emitted, and the tail it crossfades into its next chunk."""

    def __init__(self) -> None:
        self.num_emitted = 0  # samples returned so far
        self._tail = np.zeros(0, dtype=np.float32)  # samples [num_emitted, num_emitted + len)

    def emit(self, chunk: Chunk, audio: np.ndarray, origin: int) -> np.ndarray:
        """The samples `chunk` adds to the stream, given its decoded `audio` (the stream's
        samples from `origin` on): the previous tail crossfaded in, up to this chunk's seam,
        whose span is kept as the next tail. A stream's chunks are emitted in plan order."""
        assert origin <= chunk.emit_lo == self.num_emitted
        assert origin + len(audio) >= chunk.seam_end

        def span(lo: int, hi: int) -> np.ndarray:
            return audio[lo - origin : hi - origin]

        parts = []
        pos = chunk.emit_lo
        num_fade = len(self._tail)
        if num_fade:
            gains = fade_in(num_fade)
            parts.append(self._tail * (1.0 - gains) + span(pos, pos + num_fade) * gains)
            pos += num_fade
        parts.append(span(pos, chunk.seam_start))
        self._tail = span(chunk.seam_start, chunk.seam_end).copy()
        self.num_emitted = chunk.seam_start
        return np.concatenate(parts).astype(np.float32, copy=False)
