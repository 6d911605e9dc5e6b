"""Wire encodings: each decodes back, with reference decoders, to the audio that went in."""

from __future__ import annotations

import io
import struct
import warnings

import av
import numpy as np
import pytest
import soundfile as sf

from chattts_server.audio.encoding import (
    SUPPORTED_ENCODINGS,
    SUPPORTED_SAMPLE_RATES,
    EncodedChunk,
    linear_to_alaw,
    linear_to_ulaw,
    make_encoder,
)
from chattts_server.audio.opus import OggOpusWriter, ogg_crc32

SOURCE_RATE_HZ = 24000
TONE_HZ = 440.0
ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
RAW_SUBTYPES = {"LINEAR16": "PCM_16", "MULAW": "ULAW", "ALAW": "ALAW", "FLOAT32": "FLOAT"}
# The largest G.711 quantization step, in 16-bit units, for mu-law and A-law alike;
# decode(encode(x)) is within one step of x.
G711_MAX_STEP = 1024


def _tone(num_samples: int, rate_hz: int = SOURCE_RATE_HZ, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(num_samples) / rate_hz
    return (amplitude * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def _encode_in_chunks(
    encoder, pcm: np.ndarray, seed: int = 0, max_chunk: int = 5000
) -> list[EncodedChunk]:
    rng = np.random.default_rng(seed)
    chunks, start = [], 0
    while start < pcm.size:
        size = int(rng.integers(0, max_chunk))
        chunks.append(encoder.encode(pcm[start : start + size]))
        start += size
    chunks.append(encoder.flush())
    return chunks


def _decode_raw(data: bytes, encoding: str, rate_hz: int) -> np.ndarray:
    """libsndfile's decoding of headerless PCM / G.711 bytes, as float64 in [-1, 1]."""
    audio, _ = sf.read(
        io.BytesIO(data),
        samplerate=rate_hz,
        channels=1,
        format="RAW",
        subtype=RAW_SUBTYPES[encoding],
        endian="LITTLE",
        dtype="float64",
    )
    return audio


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- G.711 against the reference algorithm -------------------------------------------------


def _g711_search(value: int, seg_end: list[int]) -> int:
    for i, end in enumerate(seg_end):
        if value <= end:
            return i
    return len(seg_end)


def _reference_ulaw(pcm_val: int) -> int:
    """Line-by-line port of linear2ulaw from Sun's g711.c (the code audioop is built on)."""
    seg_uend = [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]
    pcm_val >>= 2
    if pcm_val < 0:
        pcm_val = -pcm_val
        mask = 0x7F
    else:
        mask = 0xFF
    pcm_val = min(pcm_val, 8159) + (0x84 >> 2)
    seg = _g711_search(pcm_val, seg_uend)
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((pcm_val >> (seg + 1)) & 0xF)) ^ mask


def _reference_alaw(pcm_val: int) -> int:
    """Line-by-line port of linear2alaw from Sun's g711.c."""
    seg_aend = [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]
    pcm_val >>= 3
    if pcm_val >= 0:
        mask = 0xD5
    else:
        mask = 0x55
        pcm_val = -pcm_val - 1
    seg = _g711_search(pcm_val, seg_aend)
    if seg >= 8:
        return 0x7F ^ mask
    aval = seg << 4
    aval |= (pcm_val >> 1) & 0xF if seg < 2 else (pcm_val >> seg) & 0xF
    return aval ^ mask


@pytest.mark.parametrize(
    ("ours", "reference"), [(linear_to_ulaw, _reference_ulaw), (linear_to_alaw, _reference_alaw)]
)
def test_g711_matches_reference_for_every_int16(ours, reference) -> None:
    expected = np.array([reference(int(v)) for v in ALL_INT16], dtype=np.uint8)
    assert np.array_equal(ours(ALL_INT16), expected)


@pytest.mark.parametrize(
    ("ours", "name"), [(linear_to_ulaw, "lin2ulaw"), (linear_to_alaw, "lin2alaw")]
)
def test_g711_matches_audioop(ours, name) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")  # removed in Python 3.13
    expected = np.frombuffer(getattr(audioop, name)(ALL_INT16.tobytes(), 2), dtype=np.uint8)
    assert np.array_equal(ours(ALL_INT16), expected)


@pytest.mark.parametrize(
    ("ours", "codec"), [(linear_to_ulaw, "pcm_mulaw"), (linear_to_alaw, "pcm_alaw")]
)
def test_g711_decodes_with_ffmpeg(ours, codec) -> None:
    codes = ours(ALL_INT16)
    decoder = av.CodecContext.create(codec, "r")
    decoder.sample_rate = 8000
    decoder.layout = "mono"
    decoded = np.concatenate(
        [frame.to_ndarray()[0] for frame in decoder.decode(av.Packet(codes.tobytes()))]
    ).astype(np.int32)
    assert decoded.size == ALL_INT16.size
    assert np.abs(decoded - ALL_INT16.astype(np.int32)).max() <= G711_MAX_STEP
    # Every code decodes to a value that encodes back to the same code (mu-law has two zeros).
    all_codes = np.arange(256, dtype=np.uint8)
    table = np.concatenate(
        [frame.to_ndarray()[0] for frame in decoder.decode(av.Packet(all_codes.tobytes()))]
    )
    recoded = ours(table.astype(np.int16))
    same = recoded == all_codes
    assert same.all() or (codec == "pcm_mulaw" and set(np.flatnonzero(~same)) == {0x7F})


# ---- PCM-family encodings through make_encoder ------------------------------------------------


@pytest.mark.parametrize("rate_hz", SUPPORTED_SAMPLE_RATES)
def test_linear16_at_every_rate(rate_hz: int) -> None:
    pcm = _tone(SOURCE_RATE_HZ + 11)
    chunks = _encode_in_chunks(make_encoder("LINEAR16", rate_hz, SOURCE_RATE_HZ), pcm, seed=rate_hz)
    data = b"".join(c.data for c in chunks)
    num_samples = sum(c.num_samples for c in chunks)

    assert len(data) == 2 * num_samples
    assert abs(num_samples - pcm.size * rate_hz / SOURCE_RATE_HZ) <= 1
    whole = make_encoder("LINEAR16", rate_hz, SOURCE_RATE_HZ)
    whole_data = whole.encode(pcm).data + whole.flush().data
    chunked16 = np.frombuffer(data, dtype="<i2").astype(np.int32)
    whole16 = np.frombuffer(whole_data, dtype="<i2").astype(np.int32)
    assert chunked16.size == whole16.size
    # Identical in practice; one LSB allows a float32 rounding difference in the resampler.
    assert np.abs(chunked16 - whole16).max() <= 1

    decoded = _decode_raw(data, "LINEAR16", rate_hz)
    ideal = _tone(decoded.size, rate_hz)
    middle = slice(decoded.size // 10, -decoded.size // 10)
    assert np.abs(decoded[middle] - ideal[middle]).max() < 1e-4


@pytest.mark.parametrize(
    ("encoding", "rate_hz", "tolerance"),
    [
        ("MULAW", 8000, 0.02),
        ("ALAW", 16000, 0.02),
        ("FLOAT32", 44100, 1e-5),
        ("LINEAR16", 22050, 1e-4),
    ],
)
def test_pcm_encodings_decode_to_the_input(encoding: str, rate_hz: int, tolerance: float) -> None:
    pcm = _tone(SOURCE_RATE_HZ // 2)
    encoder = make_encoder(encoding, rate_hz, SOURCE_RATE_HZ)
    assert encoder.encoding == encoding and encoder.sample_rate_hz == rate_hz
    chunks = _encode_in_chunks(encoder, pcm, seed=1)
    data = b"".join(c.data for c in chunks)
    decoded = _decode_raw(data, encoding, rate_hz)
    assert decoded.size == sum(c.num_samples for c in chunks)
    assert abs(decoded.size - pcm.size * rate_hz / SOURCE_RATE_HZ) <= 1
    ideal = _tone(decoded.size, rate_hz)
    middle = slice(decoded.size // 10, -decoded.size // 10)
    # G.711 error at amplitude 0.5 is up to half the top step, 512 / 32768 = 0.0156.
    assert np.abs(decoded[middle] - ideal[middle]).max() < tolerance


@pytest.mark.parametrize("encoding", ["LINEAR16", "MULAW", "ALAW", "FLOAT32"])
def test_chunking_is_invisible_at_the_source_rate(encoding: str) -> None:
    pcm = _tone(SOURCE_RATE_HZ, amplitude=0.9) + np.float32(0.01)
    chunked = _encode_in_chunks(make_encoder(encoding, SOURCE_RATE_HZ, SOURCE_RATE_HZ), pcm, seed=2)
    whole = make_encoder(encoding, SOURCE_RATE_HZ, SOURCE_RATE_HZ)
    assert b"".join(c.data for c in chunked) == whole.encode(pcm).data + whole.flush().data
    assert sum(c.num_samples for c in chunked) == pcm.size


def test_clipping() -> None:
    pcm = np.array([1.5, -1.5, 1.0, -1.0, 0.0, 1e-6], dtype=np.float32)
    linear16 = make_encoder("LINEAR16", SOURCE_RATE_HZ, SOURCE_RATE_HZ).encode(pcm).data
    assert np.frombuffer(linear16, dtype="<i2").tolist() == [32767, -32767, 32767, -32767, 0, 0]
    float32 = make_encoder("FLOAT32", SOURCE_RATE_HZ, SOURCE_RATE_HZ).encode(pcm).data
    assert np.frombuffer(float32, dtype="<f4").tolist() == pytest.approx(
        [1.0, -1.0, 1.0, -1.0, 0.0, 1e-6]
    )
    mulaw = make_encoder("MULAW", SOURCE_RATE_HZ, SOURCE_RATE_HZ).encode(pcm).data
    assert mulaw[:2] == bytes(linear_to_ulaw(np.array([32767, -32767], dtype=np.int16)))


def test_make_encoder_rejects_unsupported() -> None:
    assert set(SUPPORTED_ENCODINGS) == {"LINEAR16", "MULAW", "ALAW", "OGG_OPUS", "FLOAT32"}
    with pytest.raises(ValueError):
        make_encoder("MP3", 24000, SOURCE_RATE_HZ)
    with pytest.raises(ValueError):
        make_encoder("LINEAR16", 32000, SOURCE_RATE_HZ)


# ---- Ogg Opus ----------------------------------------------------------------------------------


def _reference_ogg_crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def _ogg_pages(data: bytes) -> list[dict]:
    """Splits bytes into Ogg pages, checking each is whole and its CRC is right."""
    pages, pos = [], 0
    while pos < len(data):
        assert data[pos : pos + 4] == b"OggS", f"no page starts at byte {pos}"
        flags, granule, serial, sequence, crc, num_lacing = struct.unpack_from(
            "<xBqIIIB", data, pos + 4
        )
        lacing = data[pos + 27 : pos + 27 + num_lacing]
        end = pos + 27 + num_lacing + sum(lacing)
        assert end <= len(data), "page cut off"
        page = bytearray(data[pos:end])
        page[22:26] = b"\0\0\0\0"
        assert crc == ogg_crc32(bytes(page))
        pages.append(
            {
                "flags": flags,
                "granule": granule,
                "serial": serial,
                "sequence": sequence,
                "body": data[pos + 27 + num_lacing : end],
            }
        )
        pos = end
    return pages


def _decode_opus_with_ffmpeg(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        rate_hz = stream.codec_context.sample_rate
    return (np.concatenate(frames) if frames else np.zeros(0, np.float32)), rate_hz


def test_ogg_crc_matches_bitwise_reference() -> None:
    rng = np.random.default_rng(3)
    for size in (0, 1, 27, 1000):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert ogg_crc32(data) == _reference_ogg_crc(data)
    assert ogg_crc32(b"OggS") == _reference_ogg_crc(b"OggS") != 0


@pytest.mark.parametrize("rate_hz", SUPPORTED_SAMPLE_RATES)
def test_ogg_opus_decodes_to_the_input(rate_hz: int) -> None:
    pcm = _tone(SOURCE_RATE_HZ + 123)
    encoder = make_encoder("OGG_OPUS", rate_hz, SOURCE_RATE_HZ)
    opus_rate_hz = rate_hz if rate_hz in (8000, 16000, 24000, 48000) else 48000
    assert encoder.sample_rate_hz == opus_rate_hz
    chunks = _encode_in_chunks(encoder, pcm, seed=rate_hz)
    data = b"".join(c.data for c in chunks)
    num_samples = sum(c.num_samples for c in chunks)
    assert abs(num_samples - pcm.size * opus_rate_hz / SOURCE_RATE_HZ) <= 1

    # Every chunk is whole pages; one logical stream, BOS first, EOS last, sequence contiguous.
    pages = [page for chunk in chunks for page in _ogg_pages(chunk.data)]
    assert [p["sequence"] for p in pages] == list(range(len(pages)))
    assert {p["serial"] for p in pages} == {pages[0]["serial"]}
    assert [p["flags"] for p in pages] == [0x02] + [0] * (len(pages) - 2) + [0x04]
    head, tags = pages[0]["body"], pages[1]["body"]
    assert head[:8] == b"OpusHead" and tags[:8] == b"OpusTags"
    assert struct.unpack_from("<I", head, 12)[0] == rate_hz  # input sample rate field
    pre_skip = struct.unpack_from("<H", head, 10)[0]
    assert pages[-1]["granule"] - pre_skip == num_samples * 48000 // opus_rate_hz

    # ffmpeg decodes at 48 kHz and applies pre-skip and end trimming: exact length.
    decoded, decoded_rate_hz = _decode_opus_with_ffmpeg(data)
    assert decoded_rate_hz == 48000
    assert decoded.size == num_samples * 48000 // opus_rate_hz
    ideal = _tone(decoded.size, decoded_rate_hz)
    middle = slice(decoded.size // 10, -decoded.size // 10)
    assert _correlation(decoded[middle], ideal[middle]) > 0.9

    # libsndfile (libogg + libopus) decodes at the OpusHead input rate, or the next Opus rate up.
    sf_decoded, sf_rate_hz = sf.read(io.BytesIO(data), dtype="float32")
    assert sf_decoded.size == pytest.approx(num_samples * sf_rate_hz / opus_rate_hz, abs=1)
    sf_ideal = _tone(sf_decoded.size, sf_rate_hz)
    sf_middle = slice(sf_decoded.size // 10, -sf_decoded.size // 10)
    assert _correlation(sf_decoded[sf_middle], sf_ideal[sf_middle]) > 0.9


def test_ogg_opus_streams_every_chunk() -> None:
    """Each encode() returns the pages for all whole frames so far, and the sample counts match
    what a decoder gets from the bytes so far."""
    rate_hz = 24000
    frame_size = 480
    encoder = make_encoder("OGG_OPUS", rate_hz, SOURCE_RATE_HZ)
    pcm = _tone(rate_hz)
    received, num_samples_so_far = b"", 0
    for k, start in enumerate(range(0, pcm.size, 2400)):
        chunk = encoder.encode(pcm[start : start + 2400])
        if k == 0:
            assert chunk.data.startswith(b"OggS") and b"OpusHead" in chunk.data[:64]
        assert chunk.data, "every 100 ms chunk completes frames"
        received += chunk.data
        num_samples_so_far += chunk.num_samples
        given = start + 2400
        # Held back at most: a partial frame and the encoder lookahead (6.5 ms).
        assert given - num_samples_so_far < frame_size + rate_hz * 0.0065 + 1
        decoded, _ = _decode_opus_with_ffmpeg(received)
        assert decoded.size == 2 * num_samples_so_far
    final = encoder.flush()
    assert num_samples_so_far + final.num_samples == pcm.size


def test_ogg_opus_partial_frames_wait() -> None:
    writer = OggOpusWriter(16000)
    data, num_samples = writer.write(np.zeros(100, dtype=np.float32))
    assert [p["body"][:8] for p in _ogg_pages(data)] == [b"OpusHead", b"OpusTags"]
    assert num_samples == 0
    data, num_samples = writer.write(np.zeros(100, dtype=np.float32))
    assert (data, num_samples) == (b"", 0)
    data, num_samples = writer.close()
    assert num_samples == 200
    assert _ogg_pages(data)[-1]["flags"] == 0x04


def test_ogg_opus_empty_stream_is_valid() -> None:
    encoder = make_encoder("OGG_OPUS", 48000, SOURCE_RATE_HZ)
    chunk = encoder.flush()
    assert chunk.num_samples == 0
    decoded, _ = _decode_opus_with_ffmpeg(chunk.data)
    assert decoded.size == 0
