"""Write LINEAR16 audio to WAV as it arrives, to a file or to a pipe."""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

import numpy as np
import soundfile as sf

# RIFF and data sizes for a WAV whose length is not known when the header is written: readers
# (aplay, ffmpeg, sox, libsndfile) then read until the end of the stream.
_STREAMING_SIZE = 0xFFFFFFFF


def pcm16_to_float(pcm: bytes) -> np.ndarray:
    """Signed 16-bit little-endian PCM bytes to float32 samples in [-1, 1)."""
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def streaming_wav_header(sample_rate: int, num_channels: int = 1) -> bytes:
    """A 44-byte PCM16 WAV header with the maximum sizes, for output that cannot seek."""
    block_align = 2 * num_channels
    return (
        b"RIFF"
        + struct.pack("<I", _STREAMING_SIZE)
        + b"WAVEfmt "
        + struct.pack(
            "<IHHIIHH", 16, 1, num_channels, sample_rate, sample_rate * block_align, block_align, 16
        )
        + b"data"
        + struct.pack("<I", _STREAMING_SIZE)
    )


def _is_seekable(f: BinaryIO) -> bool:
    try:
        return f.seekable()
    except (AttributeError, OSError, ValueError):
        return False


class WavWriter:
    """Append LINEAR16 (PCM16 LE) bytes to a mono WAV as they come.

    To a path or a seekable binary file, libsndfile writes the header at once and patches the
    sizes on `close`. To an unseekable stream (stdout, a pipe) it writes a header with maximum
    sizes and never seeks, so `... | aplay` plays while audio arrives. A file object passed in is
    flushed but not closed.
    """

    def __init__(
        self,
        path_or_file: str | os.PathLike[str] | BinaryIO,
        sample_rate: int,
        num_channels: int = 1,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.sample_rate = sample_rate
        self.num_channels = num_channels
        self.num_frames = 0
        self._frame_bytes = 2 * num_channels
        self._pending = b""  # an incomplete frame left over from the last write
        self._sf: sf.SoundFile | None = None
        self._raw: BinaryIO | None = None
        if isinstance(path_or_file, (str, os.PathLike)) or _is_seekable(path_or_file):
            self._sf = sf.SoundFile(
                path_or_file,
                mode="w",
                samplerate=sample_rate,
                channels=num_channels,
                format="WAV",
                subtype="PCM_16",
            )
        else:
            self._raw = path_or_file
            self._raw.write(streaming_wav_header(sample_rate, num_channels))
            self._raw.flush()
        self.closed = False

    def write(self, pcm: bytes) -> None:
        """Append PCM16 LE bytes; a trailing partial frame waits for the next write."""
        if self.closed:
            raise ValueError("write to a closed WavWriter")
        data = self._pending + pcm
        usable = len(data) - len(data) % self._frame_bytes
        self._pending = data[usable:]
        if not usable:
            return
        frames = data[:usable]
        self.num_frames += usable // self._frame_bytes
        if self._sf is not None:
            samples = np.frombuffer(frames, dtype="<i2").reshape(-1, self.num_channels)
            self._sf.write(samples)
        else:
            assert self._raw is not None
            self._raw.write(frames)
            self._raw.flush()

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.sample_rate

    def close(self) -> None:
        """Finish the file: patch sizes (seekable) or flush (stream). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._sf is not None:
            self._sf.close()
        elif self._raw is not None:
            self._raw.flush()

    def __enter__(self) -> WavWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
