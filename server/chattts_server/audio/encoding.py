"""Streaming encoders from the engine's float32 PCM to the wire encodings of tts.proto.

Every encoder resamples from the engine rate, clips to [-1, 1] and encodes chunk by chunk, and
keeps whatever state the encoding needs (resampler filter, partial Opus frame) between chunks.

OGG_OPUS needs PyAV (the `av` package, libopus inside), imported only when an Ogg Opus stream
starts: a server without it starts, serves the other encodings and refuses OGG_OPUS.
"""

from __future__ import annotations

import importlib.util
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chattts_server.audio.opus import OPUS_ENCODER_RATES, OggOpusWriter
from chattts_server.audio.resample import StreamResampler

log = logging.getLogger(__name__)

SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
SUPPORTED_ENCODINGS = ("LINEAR16", "MULAW", "ALAW", "OGG_OPUS", "FLOAT32")
# Opus stream rate for requested rates libopus cannot encode at (22050, 44100).
_OPUS_FALLBACK_RATE_HZ = 48000


class EncodingUnavailable(RuntimeError):
    """The encoding's library is not installed (OGG_OPUS without PyAV)."""


def _pyav_installed() -> bool:
    try:
        return importlib.util.find_spec("av") is not None
    except (ImportError, ValueError):
        return False


PYAV_ENCODINGS = ("OGG_OPUS", "MP3", "AAC", "FLAC")
"""The encodings whose codec comes from PyAV (audio/opus.py, audio/containers.py)."""


def available_encodings(encodings: tuple[str, ...] = SUPPORTED_ENCODINGS) -> tuple[str, ...]:
    """`encodings` less those whose library is missing here (found without importing it): the
    one check of what this server can encode, which requests at every door are validated by."""
    if _pyav_installed():
        return encodings
    off = [e for e in encodings if e in PYAV_ENCODINGS]
    if off:  # bench/gpu_check.sh looks for the first words
        log.warning(
            "%s is off: it needs PyAV (the av package), which is not installed%s",
            off[0],
            f"; so are {', '.join(off[1:])}" if off[1:] else "",
        )
    return tuple(e for e in encodings if e not in PYAV_ENCODINGS)


@dataclass(frozen=True)
class EncodedChunk:
    data: bytes
    # Samples at the encoder's `sample_rate_hz` that `data` carries. Over a stream they add up
    # to the whole output, so a running sum gives each chunk's sample_offset.
    num_samples: int


class StreamEncoder(ABC):
    """Encodes one stream of mono float32 PCM at the source rate into one wire encoding.

    Call `encode` for each chunk in order and `flush` once at the end; the concatenation of the
    returned `data` is the encoded stream.
    """

    encoding: str
    # The rate of the decoded audio and of every `num_samples`: the requested rate, except for
    # OGG_OPUS at 22050 and 44100 Hz, which is encoded (and counted) at 48000 Hz.
    sample_rate_hz: int

    @abstractmethod
    def encode(self, pcm: np.ndarray) -> EncodedChunk:
        """Encodes a chunk; may return fewer samples than given (held by the resampler or as a
        partial Opus frame) and returns them from a later call or `flush`."""

    @abstractmethod
    def flush(self) -> EncodedChunk:
        """Encodes everything still held and ends the stream."""

    def end_utterance(self) -> EncodedChunk:
        """An utterance (a separately generated signal) ended: release what belongs to it.

        Sample encodings flush the resampler and start a fresh one, so each utterance's last
        samples leave with it. Ogg Opus keeps its state: the Ogg stream spans the whole call.
        """
        return EncodedChunk(b"", 0)


def float_to_int16(pcm: np.ndarray) -> np.ndarray:
    """Clips to [-1, 1] and scales by 32767, rounding to nearest."""
    return np.rint(np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)


# Segment end points of the Sun / ITU-T G.711 reference code (g711.c, which audioop uses).
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
_ULAW_BIAS = 0x84 >> 2
_ULAW_CLIP = 8159


def linear_to_ulaw(pcm16: np.ndarray) -> np.ndarray:
    """G.711 mu-law of 16-bit PCM, bit-exact with g711.c's linear2ulaw (and audioop.lin2ulaw)."""
    v = pcm16.astype(np.int32) >> 2  # the reference works on 14-bit values
    mask = np.where(v < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(v), _ULAW_CLIP) + _ULAW_BIAS
    segment = np.searchsorted(_ULAW_SEG_END, magnitude)
    code = (np.minimum(segment, 7) << 4) | ((magnitude >> (segment + 1)) & 0xF)
    code = np.where(segment >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def linear_to_alaw(pcm16: np.ndarray) -> np.ndarray:
    """G.711 A-law of 16-bit PCM, bit-exact with g711.c's linear2alaw (and audioop.lin2alaw)."""
    v = pcm16.astype(np.int32) >> 3  # the reference works on 13-bit values
    negative = v < 0
    mask = np.where(negative, 0x55, 0xD5)
    magnitude = np.where(negative, -v - 1, v)  # 0..4095, so the segment is at most 7
    segment = np.searchsorted(_ALAW_SEG_END, magnitude)
    quantized = (magnitude >> np.maximum(segment, 1)) & 0xF
    return (((segment << 4) | quantized) ^ mask).astype(np.uint8)


_PCM_CONVERTERS: dict[str, Callable[[np.ndarray], bytes]] = {
    "LINEAR16": lambda x: float_to_int16(x).astype("<i2").tobytes(),
    "MULAW": lambda x: linear_to_ulaw(float_to_int16(x)).tobytes(),
    "ALAW": lambda x: linear_to_alaw(float_to_int16(x)).tobytes(),
    # tts.proto promises FLOAT32 in [-1, 1], so it is clipped too.
    "FLOAT32": lambda x: np.clip(x, -1.0, 1.0).astype("<f4").tobytes(),
}


class _PcmEncoder(StreamEncoder):
    """Sample-by-sample encodings: each output sample becomes a fixed number of bytes."""

    def __init__(self, encoding: str, sample_rate_hz: int, source_rate_hz: int) -> None:
        self.encoding = encoding
        self.sample_rate_hz = sample_rate_hz
        self._convert = _PCM_CONVERTERS[encoding]
        self._source_rate_hz = source_rate_hz
        self._resampler = StreamResampler(source_rate_hz, sample_rate_hz)

    def encode(self, pcm: np.ndarray) -> EncodedChunk:
        return self._chunk(self._resampler.process(pcm))

    def flush(self) -> EncodedChunk:
        return self._chunk(self._resampler.flush())

    def end_utterance(self) -> EncodedChunk:
        tail = self._chunk(self._resampler.flush())
        self._resampler = StreamResampler(self._source_rate_hz, self.sample_rate_hz)
        return tail

    def _chunk(self, samples: np.ndarray) -> EncodedChunk:
        return EncodedChunk(self._convert(samples), samples.size)


class _OggOpusEncoder(StreamEncoder):
    """Ogg Opus, 20 ms frames. Rates libopus supports (8, 16, 24, 48 kHz) are encoded as asked;
    22050 and 44100 Hz are encoded at 48 kHz, with the requested rate in OpusHead's
    input-sample-rate field; `sample_rate_hz` is then 48000. Most players decode Ogg Opus at
    48 kHz whatever the encoder rate was (libsndfile at the OpusHead rate rounded up to an Opus
    rate), so the encoder rate mainly sets the audio bandwidth.

    `num_samples` counts the samples a decoder returns for the pages in `data` (after the
    pre-skip). The first chunk carries the OpusHead and OpusTags pages and lacks the encoder
    lookahead (6.5 ms with libopus); each chunk holds back a partial 20 ms frame; `flush` pads
    and ends the stream with a granule position that trims the padding, so the decoded length
    is exact and the counts sum to it.
    """

    encoding = "OGG_OPUS"

    def __init__(self, sample_rate_hz: int, source_rate_hz: int) -> None:
        opus_rate_hz = (
            sample_rate_hz if sample_rate_hz in OPUS_ENCODER_RATES else _OPUS_FALLBACK_RATE_HZ
        )
        try:
            self._writer = OggOpusWriter(opus_rate_hz, input_rate_hz=sample_rate_hz)
        except ImportError as exc:
            raise EncodingUnavailable(
                f"OGG_OPUS needs PyAV (the av package), which cannot be imported: {exc}"
            ) from exc
        self.sample_rate_hz = opus_rate_hz
        self._resampler = StreamResampler(source_rate_hz, opus_rate_hz)

    def encode(self, pcm: np.ndarray) -> EncodedChunk:
        return EncodedChunk(*self._writer.write(self._resampler.process(pcm)))

    def flush(self) -> EncodedChunk:
        tail, num_tail = self._writer.write(self._resampler.flush())
        end, num_end = self._writer.close()
        return EncodedChunk(tail + end, num_tail + num_end)


def make_encoder(encoding: str, sample_rate_hz: int, source_rate_hz: int) -> StreamEncoder:
    """A fresh encoder for one stream, from PCM at `source_rate_hz` (the model's rate,
    `ModelInfo.sample_rate`). `encoding` is a tts.proto AudioEncoding name and `sample_rate_hz`
    one of SUPPORTED_SAMPLE_RATES; anything else raises ValueError, and OGG_OPUS without PyAV
    raises EncodingUnavailable."""
    if encoding not in SUPPORTED_ENCODINGS:
        raise ValueError(f"unsupported encoding {encoding!r}; supported: {SUPPORTED_ENCODINGS}")
    if sample_rate_hz not in SUPPORTED_SAMPLE_RATES:
        raise ValueError(
            f"unsupported sample rate {sample_rate_hz} Hz; supported: {SUPPORTED_SAMPLE_RATES}"
        )
    if encoding == "OGG_OPUS":
        return _OggOpusEncoder(sample_rate_hz, source_rate_hz)
    return _PcmEncoder(encoding, sample_rate_hz, source_rate_hz)
