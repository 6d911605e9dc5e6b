"""Streaming Ogg Opus (RFC 7845): libopus through PyAV, Ogg pages written here.

We write the Ogg pages ourselves rather than through libavformat's Ogg muxer because the muxer
holds back the last page or two for its end-of-stream flag (40 ms or more of added latency per
chunk unless flushed through an API PyAV does not expose), writes the encoder's rate into
OpusHead, and leaves end trimming to packet durations. Here every `write` returns pages for all
complete 20 ms frames given so far, and the last page carries the exact end granule.

PyAV is imported when a writer is made, never at import time, so `OPUS_ENCODER_RATES` (and this
module) are there on a server without PyAV, which refuses OGG_OPUS.
"""

from __future__ import annotations

import random
import struct
import zlib
from typing import Any

import numpy as np

# The rates libopus encodes at. Other rates must be resampled to one of these first.
OPUS_ENCODER_RATES = (8000, 12000, 16000, 24000, 48000)
# Ogg Opus granule positions always count samples at 48 kHz (RFC 7845 section 4).
_GRANULE_RATE_HZ = 48000
_VENDOR = b"chattts-stream"
_MAX_LACING_VALUES = 255

_HEADER_BOS = 0x02
_HEADER_EOS = 0x04


# Ogg's CRC-32 is the non-reflected form of zlib's polynomial with zero init and no final xor.
# Reflecting the bits of every input byte and of the result turns it into zlib's reflected
# CRC, which runs in C rather than a Python loop over every byte of every page.
_REVERSE_BITS = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc32(data: bytes) -> int:
    """The CRC-32 of an Ogg page (polynomial 0x04C11DB7, init 0, no reflection, no xor-out)."""
    register = zlib.crc32(data.translate(_REVERSE_BITS), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{register:032b}"[::-1], 2)


class OggOpusWriter:
    """Encodes mono float32 PCM at one of `OPUS_ENCODER_RATES` into an Ogg Opus stream.

    `write` returns the bytes of the Ogg pages completed by that call: the first call's bytes
    start with the OpusHead and OpusTags pages, then one or more audio pages holding every full
    frame given so far. A partial frame waits for the next call; `close` pads it with silence,
    drains the encoder and ends the stream with an end-of-stream page whose granule position
    trims the padding, so decoders return exactly the samples given.

    The sample counts returned are the samples that a decoder returns (after the pre-skip) for
    the pages returned, at the encoder rate. They lag the input by the encoder lookahead
    (6.5 ms) plus the partial frame, and over the whole stream they sum to the samples given.
    """

    def __init__(
        self,
        sample_rate_hz: int,
        *,
        input_rate_hz: int | None = None,
        bitrate_bps: int = 32000,
        frame_duration_ms: int = 20,
        serial_number: int | None = None,
    ) -> None:
        """`input_rate_hz` goes into OpusHead's informational input-sample-rate field
        (default: `sample_rate_hz`); decoders may use it as their output rate."""
        if sample_rate_hz not in OPUS_ENCODER_RATES:
            raise ValueError(f"libopus cannot encode at {sample_rate_hz} Hz")
        import av  # ImportError here: this server has no PyAV (the caller says so)

        self._av: Any = av
        self.sample_rate_hz = sample_rate_hz
        self._granule_per_sample = _GRANULE_RATE_HZ // sample_rate_hz

        codec = av.CodecContext.create("libopus", "w")
        codec.sample_rate = sample_rate_hz
        codec.layout = "mono"
        codec.format = "flt"
        codec.bit_rate = bitrate_bps
        codec.options = {"frame_duration": str(frame_duration_ms), "application": "audio"}
        codec.open()
        self._codec = codec
        self._frame_size = codec.frame_size
        # libavcodec's OpusHead: magic, version, channels, pre-skip (48 kHz samples), input
        # rate, output gain, mapping family.
        head = bytearray(codec.extradata or b"")
        if len(head) < 19 or head[:8] != b"OpusHead":
            raise RuntimeError("libopus encoder returned no OpusHead")
        struct.pack_into("<I", head, 12, input_rate_hz or sample_rate_hz)
        self._opus_head = bytes(head)
        self._pre_skip = struct.unpack_from("<H", head, 10)[0]

        self._serial_number = (
            random.getrandbits(32) if serial_number is None else serial_number & 0xFFFFFFFF
        )
        self._page_sequence = 0
        self._pending = np.zeros(0, dtype=np.float32)  # the partial frame not yet encoded
        self._num_frames_encoded = 0
        self._num_samples_in = 0
        self._num_packets = 0
        self._num_samples_out = 0
        self._started = False
        self._closed = False

    def write(self, pcm: np.ndarray) -> tuple[bytes, int]:
        """Encodes `pcm`; returns the completed pages and the samples they add."""
        if self._closed:
            raise RuntimeError("write() after close()")
        x = np.clip(np.asarray(pcm, dtype=np.float32).reshape(-1), -1.0, 1.0)
        self._num_samples_in += x.size
        buffered = np.concatenate((self._pending, x))
        num_full = buffered.size // self._frame_size * self._frame_size
        self._pending = buffered[num_full:]
        packets = self._encode_frames(buffered[:num_full])
        return self._emit(packets, final=False)

    def close(self) -> tuple[bytes, int]:
        """Ends the stream; returns the last pages (with end-of-stream) and their samples."""
        if self._closed:
            raise RuntimeError("close() called twice")
        self._closed = True
        packets: list[bytes] = []
        if self._pending.size or self._num_frames_encoded == 0:
            padded = np.zeros(self._frame_size, dtype=np.float32)
            padded[: self._pending.size] = self._pending
            packets += self._encode_frames(padded)
        # Draining emits the packets that hold the encoder's lookahead.
        packets += [bytes(p) for p in self._codec.encode(None)]
        return self._emit(packets, final=True)

    def _encode_frames(self, samples: np.ndarray) -> list[bytes]:
        packets = []
        for start in range(0, samples.size, self._frame_size):
            frame = self._av.AudioFrame.from_ndarray(
                samples[None, start : start + self._frame_size], format="flt", layout="mono"
            )
            frame.sample_rate = self.sample_rate_hz
            frame.pts = self._num_frames_encoded * self._frame_size
            self._num_frames_encoded += 1
            packets += [bytes(p) for p in self._codec.encode(frame)]
        return packets

    def _emit(self, packets: list[bytes], *, final: bool) -> tuple[bytes, int]:
        out = bytearray()
        if not self._started:
            self._started = True
            out += self._page([self._opus_head], granule=0, flags=_HEADER_BOS)
            tags = b"OpusTags" + struct.pack("<I", len(_VENDOR)) + _VENDOR + struct.pack("<I", 0)
            out += self._page([tags], granule=0)

        # Every packet decodes to one full frame; the last page's granule instead marks the
        # true end, which tells the decoder to drop the padding (RFC 7845 section 4.4).
        end_granule = self._pre_skip + self._num_samples_in * self._granule_per_sample
        pages = _split_pages(packets) if packets or not final else [[]]
        for i, page_packets in enumerate(pages):
            self._num_packets += len(page_packets)
            last = final and i == len(pages) - 1
            granule = end_granule if last else self._packets_granule()
            out += self._page(page_packets, granule=granule, flags=_HEADER_EOS if last else 0)

        decoded_end = end_granule if final else self._packets_granule()
        num_samples_total = max(0, decoded_end - self._pre_skip) // self._granule_per_sample
        num_samples = num_samples_total - self._num_samples_out
        self._num_samples_out = num_samples_total
        return bytes(out), num_samples

    def _packets_granule(self) -> int:
        """The 48 kHz granule at the end of the packets paged so far, counting full frames."""
        return self._num_packets * self._frame_size * self._granule_per_sample

    def _page(self, packets: list[bytes], *, granule: int, flags: int = 0) -> bytes:
        lacing = bytearray()
        for packet in packets:
            lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
        header = struct.pack(
            "<4sBBqIIIB",
            b"OggS",
            0,  # stream structure version
            flags,
            granule,
            self._serial_number,
            self._page_sequence,
            0,  # CRC, filled in below
            len(lacing),
        )
        self._page_sequence += 1
        page = bytearray(header + lacing + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc32(bytes(page)))
        return bytes(page)


def _split_pages(packets: list[bytes]) -> list[list[bytes]]:
    """Groups packets into pages of at most 255 lacing values; no packet spans two pages."""
    pages: list[list[bytes]] = []
    current: list[bytes] = []
    num_lacing = 0
    for packet in packets:
        n = len(packet) // 255 + 1
        if current and num_lacing + n > _MAX_LACING_VALUES:
            pages.append(current)
            current, num_lacing = [], 0
        current.append(packet)
        num_lacing += n
    if current:
        pages.append(current)
    return pages
