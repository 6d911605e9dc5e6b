"""StreamResampler: chunked resampling equals one-shot soxr, at every served rate."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from chattts_server.audio.resample import StreamResampler

SOURCE_RATE_HZ = 24000
OUTPUT_RATES_HZ = (8000, 16000, 22050, 24000, 44100, 48000)
# python-soxr 1.1 gives bit-identical output for any chunking (its streaming and one-shot paths
# run the same libsoxr filter over the same samples); this leaves room for a float32 rounding
# difference should a future soxr split its internal blocks differently.
MAX_ABS_DIFF = 1e-6


def _test_signal(num_samples: int, seed: int = 0) -> np.ndarray:
    """A 100 Hz to 10 kHz chirp plus light noise: energy at every band the filters touch."""
    t = np.arange(num_samples) / SOURCE_RATE_HZ
    duration_s = num_samples / SOURCE_RATE_HZ
    chirp = 0.5 * np.sin(2 * np.pi * (100 * t + (10000 - 100) / (2 * duration_s) * t**2))
    noise = 0.05 * np.random.default_rng(seed).standard_normal(num_samples)
    return (chirp + noise).astype(np.float32)


def _random_chunks(x: np.ndarray, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    chunks, start = [], 0
    while start < x.size:
        # Includes empty and one-sample chunks.
        size = int(rng.choice([0, 1, int(rng.integers(2, 200)), int(rng.integers(200, 6000))]))
        chunks.append(x[start : start + size])
        start += size
    return chunks


@pytest.mark.parametrize("out_rate_hz", OUTPUT_RATES_HZ)
def test_chunked_equals_one_shot(out_rate_hz: int) -> None:
    # An odd length, so the output length is not an exact multiple at any rate.
    x = _test_signal(2 * SOURCE_RATE_HZ + 7)
    resampler = StreamResampler(SOURCE_RATE_HZ, out_rate_hz)
    outputs = [resampler.process(chunk) for chunk in _random_chunks(x, seed=out_rate_hz)]
    outputs.append(resampler.flush())
    streamed = np.concatenate(outputs)

    expected = soxr.resample(x, SOURCE_RATE_HZ, out_rate_hz, quality="HQ")
    assert streamed.dtype == np.float32
    assert streamed.size == expected.size
    assert abs(streamed.size - x.size * out_rate_hz / SOURCE_RATE_HZ) <= 1
    np.testing.assert_allclose(streamed, expected, rtol=0, atol=MAX_ABS_DIFF)


@pytest.mark.parametrize("out_rate_hz", OUTPUT_RATES_HZ)
def test_output_is_the_tone_at_the_new_rate(out_rate_hz: int) -> None:
    # Checks the filter delay is compensated: the output lines up with the input in time.
    tone_hz = 1000.0
    x = (0.5 * np.sin(2 * np.pi * tone_hz * np.arange(SOURCE_RATE_HZ) / SOURCE_RATE_HZ)).astype(
        np.float32
    )
    resampler = StreamResampler(SOURCE_RATE_HZ, out_rate_hz)
    y = np.concatenate(
        [resampler.process(x[:10000]), resampler.process(x[10000:]), resampler.flush()]
    )
    ideal = 0.5 * np.sin(2 * np.pi * tone_hz * np.arange(y.size) / out_rate_hz)
    # Away from the edges, where the filter sees the signal start and stop.
    middle = slice(y.size // 10, -y.size // 10)
    assert np.abs(y[middle] - ideal[middle]).max() < 1e-3


def test_equal_rates_pass_through() -> None:
    x = _test_signal(1000)
    resampler = StreamResampler(24000, 24000)
    assert np.array_equal(resampler.process(x), x)
    assert resampler.flush().size == 0


def test_misuse_raises() -> None:
    with pytest.raises(ValueError):
        StreamResampler(0, 16000)
    resampler = StreamResampler(24000, 16000)
    resampler.flush()
    with pytest.raises(RuntimeError):
        resampler.process(np.zeros(10, dtype=np.float32))
    with pytest.raises(RuntimeError):
        resampler.flush()
