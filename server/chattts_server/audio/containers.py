"""Streaming WAV, MP3, AAC (ADTS) and FLAC encoders for the HTTP front door.

The OpenAI speech route offers `wav`, `mp3`, `aac` and `flac` beside `pcm` and `opus`. Each
encoder here returns bytes as soon as they are complete, so a client can start playing the
first chunk: WAV is a header with unknown lengths and then s16le PCM; MP3 (libmp3lame) is a
plain sequence of MPEG audio frames; AAC (ffmpeg's native encoder) is framed as ADTS; FLAC is
`fLaC`, the encoder's STREAMINFO block (total samples 0: unknown) and then FLAC frames. The
codecs run through PyAV, imported when an encoder is made, never at import time; the framing
is written here for the same reason as the Ogg pages in `opus.py`: libavformat's muxers hold
output back and want to seek back to patch headers, which a stream cannot do.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .encoding import EncodedChunk, StreamEncoder, float_to_int16, make_encoder
from .resample import StreamResampler

CONTAINER_ENCODINGS = ("WAV", "MP3", "AAC", "FLAC")
# The largest value of a RIFF/WAV length field: what streamed WAVs (ffmpeg's, OpenAI's) put in
# the RIFF and data sizes when the length is not known yet. Readers take "up to the end".
_WAV_UNKNOWN_SIZE = 0xFFFFFFFF
_ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000)
_ADTS_RATE_INDEX = {rate: i for i, rate in enumerate((*_ADTS_RATES, 7350))}
"""MPEG-4 sampling-frequency indices (ISO 14496-3, 1.6.3.4), for the ADTS header."""


def wav_header(sample_rate_hz: int, num_data_bytes: int = _WAV_UNKNOWN_SIZE) -> bytes:
    """A 44-byte RIFF/WAVE header for s16le mono; the default sizes say "unknown length"."""
    riff_size = _WAV_UNKNOWN_SIZE if num_data_bytes == _WAV_UNKNOWN_SIZE else 36 + num_data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,  # fmt chunk size
        1,  # PCM
        1,  # channels
        sample_rate_hz,
        sample_rate_hz * 2,  # bytes per second
        2,  # block align
        16,  # bits per sample
        b"data",
        num_data_bytes,
    )


class _WavEncoder(StreamEncoder):
    """LINEAR16 with a streamed WAV header in front of the first chunk."""

    encoding = "WAV"

    def __init__(self, sample_rate_hz: int, source_rate_hz: int) -> None:
        self._pcm = make_encoder("LINEAR16", sample_rate_hz, source_rate_hz)
        self.sample_rate_hz = self._pcm.sample_rate_hz
        self._header: bytes | None = wav_header(self.sample_rate_hz)

    def _with_header(self, chunk: EncodedChunk) -> EncodedChunk:
        if self._header is None:
            return chunk
        header, self._header = self._header, None
        return EncodedChunk(header + chunk.data, chunk.num_samples)

    def encode(self, pcm: np.ndarray) -> EncodedChunk:
        return self._with_header(self._pcm.encode(pcm))

    def end_utterance(self) -> EncodedChunk:
        return self._with_header(self._pcm.end_utterance())

    def flush(self) -> EncodedChunk:
        return self._with_header(self._pcm.flush())


class _CodecEncoder(StreamEncoder):
    """One PyAV audio encoder fed fixed-size frames; subclasses frame its packets.

    `num_samples` counts the samples handed to the codec with the packets a call returns, so
    over the stream the counts sum to the input; a decoder may return a little more (MP3 and
    AAC add encoder delay and pad the last frame, and ADTS and raw MP3 cannot say so).
    """

    codec_name: str
    sample_format: str
    bit_rate_bps: int | None = None

    def __init__(self, sample_rate_hz: int, source_rate_hz: int) -> None:
        import av  # lazily: only the HTTP formats need it here

        self._av = av
        codec: Any = av.CodecContext.create(self.codec_name, "w")
        codec.sample_rate = sample_rate_hz
        codec.layout = "mono"
        codec.format = self.sample_format
        if self.bit_rate_bps:
            codec.bit_rate = self.bit_rate_bps
        codec.open()
        self._codec = codec
        self.sample_rate_hz = sample_rate_hz
        self._frame_size = codec.frame_size or 4096
        self._resampler = StreamResampler(source_rate_hz, sample_rate_hz)
        self._pending = np.zeros(0, dtype=np.float32)
        self._pts = 0
        self._num_samples_fed = 0
        self._num_samples_reported = 0
        self._started = False
        self._closed = False

    def _stream_header(self) -> bytes:
        return b""

    def _frame_packet(self, packet: bytes) -> bytes:
        return packet

    def _feed(self, samples: np.ndarray) -> list[bytes]:
        if not samples.size:
            return []
        frame = self._av.AudioFrame.from_ndarray(
            self._samples_for_codec(samples), format=self.sample_format, layout="mono"
        )
        frame.sample_rate = self.sample_rate_hz
        frame.pts = self._pts
        self._pts += samples.size
        self._num_samples_fed += samples.size
        return [bytes(p) for p in self._codec.encode(frame)]

    def _samples_for_codec(self, samples: np.ndarray) -> np.ndarray:
        clipped = np.clip(samples, -1.0, 1.0).astype(np.float32)
        return clipped[None, :]

    def _emit(self, packets: list[bytes]) -> EncodedChunk:
        out = bytearray()
        if not self._started:
            self._started = True
            out += self._stream_header()
        for packet in packets:
            out += self._frame_packet(packet)
        if not packets and len(out) == 0:
            return EncodedChunk(b"", 0)
        num_samples = self._num_samples_fed - self._num_samples_reported
        self._num_samples_reported = self._num_samples_fed
        return EncodedChunk(bytes(out), num_samples)

    def encode(self, pcm: np.ndarray) -> EncodedChunk:
        if self._closed:
            raise RuntimeError("encode() after flush()")
        buffered = np.concatenate((self._pending, self._resampler.process(pcm)))
        num_full = buffered.size // self._frame_size * self._frame_size
        self._pending = buffered[num_full:]
        packets: list[bytes] = []
        for start in range(0, num_full, self._frame_size):
            packets += self._feed(buffered[start : start + self._frame_size])
        return self._emit(packets)

    def flush(self) -> EncodedChunk:
        if self._closed:
            raise RuntimeError("flush() called twice")
        self._closed = True
        tail = np.concatenate((self._pending, self._resampler.flush()))
        packets: list[bytes] = []
        # Every codec here takes a short last frame (AV_CODEC_CAP_SMALL_LAST_FRAME or variable
        # frame sizes); a frame is never longer than frame_size.
        for start in range(0, tail.size, self._frame_size):
            packets += self._feed(tail[start : start + self._frame_size])
        packets += [bytes(p) for p in self._codec.encode(None)]
        chunk = self._emit(packets)
        # Everything fed has been paged out: report it even if the drain returned no packet.
        rest = self._num_samples_fed - self._num_samples_reported
        self._num_samples_reported = self._num_samples_fed
        return EncodedChunk(chunk.data, chunk.num_samples + rest)


class _Mp3Encoder(_CodecEncoder):
    """MPEG-1/2 Layer III frames (libmp3lame, 64 kbit/s CBR); concatenated frames are a valid
    .mp3 stream."""

    encoding = "MP3"
    codec_name = "libmp3lame"
    sample_format = "fltp"
    bit_rate_bps = 64000


class _AacEncoder(_CodecEncoder):
    """AAC-LC (ffmpeg's encoder, 64 kbit/s), each packet behind a 7-byte ADTS header."""

    encoding = "AAC"
    codec_name = "aac"
    sample_format = "fltp"
    bit_rate_bps = 64000

    def __init__(self, sample_rate_hz: int, source_rate_hz: int) -> None:
        if sample_rate_hz not in _ADTS_RATE_INDEX:
            raise ValueError(f"ADTS cannot carry {sample_rate_hz} Hz")
        super().__init__(sample_rate_hz, source_rate_hz)
        self._rate_index = _ADTS_RATE_INDEX[sample_rate_hz]

    def _frame_packet(self, packet: bytes) -> bytes:
        length = len(packet) + 7
        profile, channels = 1, 1  # AAC LC (object type 2, minus one), mono
        header = bytes(
            (
                0xFF,
                0xF1,  # sync, MPEG-4, layer 0, no CRC
                (profile << 6) | (self._rate_index << 2) | (channels >> 2),
                ((channels & 3) << 6) | (length >> 11),
                (length >> 3) & 0xFF,
                ((length & 7) << 5) | 0x1F,  # buffer fullness 0x7FF: variable bit rate
                0xFC,  # ...and one raw data block per frame
            )
        )
        return header + packet


class _FlacEncoder(_CodecEncoder):
    """FLAC, 16-bit: `fLaC`, STREAMINFO (from the encoder, total samples unknown), frames."""

    encoding = "FLAC"
    codec_name = "flac"
    sample_format = "s16"

    def _samples_for_codec(self, samples: np.ndarray) -> np.ndarray:
        return float_to_int16(samples)[None, :]

    def _stream_header(self) -> bytes:
        info = bytes(self._codec.extradata or b"")[:34]
        if len(info) != 34:
            raise RuntimeError("the FLAC encoder returned no STREAMINFO")
        # Metadata block header: last-block flag, type 0 (STREAMINFO), 24-bit length.
        return b"fLaC" + bytes((0x80, 0, 0, 34)) + info


_ENCODERS: dict[str, type[StreamEncoder]] = {
    "WAV": _WavEncoder,
    "MP3": _Mp3Encoder,
    "AAC": _AacEncoder,
    "FLAC": _FlacEncoder,
}


def make_container_encoder(
    encoding: str, sample_rate_hz: int, source_rate_hz: int
) -> StreamEncoder:
    """A fresh encoder for one of CONTAINER_ENCODINGS."""
    return _ENCODERS[encoding](sample_rate_hz, source_rate_hz)  # type: ignore[call-arg]
