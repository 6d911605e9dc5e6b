"""Estimated word timing (timing/estimate.py), without the model: every spoken word of the
caller's text timed once, in order, without overlap, inside its utterance's audio, and
boundaries moved to the pauses of a signal made of noise bursts and silent gaps."""

from __future__ import annotations

import logging
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chattts_server.audio_constants import SAMPLE_RATE_HZ
from chattts_server.text.duration import estimate_duration_s
from chattts_server.text.normalize import TextNormalizer
from chattts_server.text.spans import Traced
from chattts_server.text.stream import utterances_traced
from chattts_server.text.words import SpokenWord, spoken_words
from chattts_server.timing.estimate import estimate_timing
from chattts_server.timing.types import ESTIMATE, UtteranceTiming
from heard_words import word_spans

SAMPLE_RATE = SAMPLE_RATE_HZ
"""The rate ChatTTS's vocoder writes (`VocosShapes.sample_rate`); the estimate takes any."""


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer()


@pytest.fixture(scope="module")
def chattts_normalizer():
    from ChatTTS.norm import Normalizer

    homophones = resources.files("ChatTTS").joinpath("res", "homophones_map.json")
    return Normalizer(str(homophones), logging.getLogger("upstream-normalizer"))


def bursts(segments_s: list[tuple[float, float]], total_s: float, seed: int = 0) -> np.ndarray:
    """Silence with white-noise bursts over the given (start, end) seconds."""
    rng = np.random.default_rng(seed)
    pcm = np.zeros(round(total_s * SAMPLE_RATE), dtype=np.float32)
    for a, b in segments_s:
        i, j = round(a * SAMPLE_RATE), round(b * SAMPLE_RATE)
        pcm[i:j] = rng.normal(0, 0.2, j - i).astype(np.float32)
    return pcm


def words_of(text: str) -> tuple[str, list[SpokenWord]]:
    """Plain spoken text and its words, each its own span."""
    return text, spoken_words(Traced.source(text))


def assert_well_formed(timing: UtteranceTiming, words: list[SpokenWord], num_samples: int) -> None:
    assert timing.source == ESTIMATE
    assert [(t.text, t.span) for t in timing.words] == [(w.text, w.span) for w in words]
    at = 0
    for t in timing.words:
        assert at <= t.start_sample <= t.end_sample <= num_samples, timing
        at = t.end_sample


def test_a_boundary_snaps_to_the_pause_between_two_words() -> None:
    # "cat" is a third of "butterfly" by the estimate (0.21 s in), the pause is at 0.35-0.50 s.
    pcm = bursts([(0.05, 0.35), (0.50, 0.70)], 0.8)
    text, words = words_of("cat butterfly")
    timing = estimate_timing(text, words, len(pcm), sample_rate=SAMPLE_RATE, pcm=pcm)
    assert_well_formed(timing, words, len(pcm))
    cat, butterfly = timing.words
    frame = SAMPLE_RATE // 100
    assert abs(cat.start_sample - 0.05 * SAMPLE_RATE) <= frame  # leading silence is no word
    assert abs(cat.end_sample - 0.35 * SAMPLE_RATE) <= frame
    assert abs(butterfly.start_sample - 0.50 * SAMPLE_RATE) <= frame
    assert abs(butterfly.end_sample - 0.70 * SAMPLE_RATE) <= frame  # nor trailing silence
    # Without the audio, the estimate alone: the audio shared by letters.
    plain = estimate_timing(text, words, len(pcm), sample_rate=SAMPLE_RATE)
    assert plain.words[0].end_sample < 0.3 * SAMPLE_RATE


def test_each_word_finds_its_own_pause_when_there_are_several() -> None:
    # Three words, three bursts: the second gap is far from where the letters put it.
    pcm = bursts([(0.0, 0.30), (0.42, 0.62), (1.10, 1.50)], 1.5, seed=1)
    text, words = words_of("turn left, then")
    timing = estimate_timing(text, words, len(pcm), sample_rate=SAMPLE_RATE, pcm=pcm)
    assert_well_formed(timing, words, len(pcm))
    frame = SAMPLE_RATE // 100
    edges = [(t.start_sample / SAMPLE_RATE, t.end_sample / SAMPLE_RATE) for t in timing.words]
    expected = [(0.0, 0.30), (0.42, 0.62), (1.10, 1.50)]
    for (a, b), (c, d) in zip(edges, expected, strict=True):
        assert abs(a - c) * SAMPLE_RATE <= frame and abs(b - d) * SAMPLE_RATE <= frame, edges


def test_pauses_the_text_marks_are_shared_out_without_audio() -> None:
    text, words = words_of("Wait [uv_break] here")
    timing = estimate_timing(text, words, SAMPLE_RATE, sample_rate=SAMPLE_RATE)
    wait, here = timing.words
    assert here.start_sample - wait.end_sample > 0.2 * SAMPLE_RATE  # the break's 0.4 s share


@pytest.mark.parametrize("num_samples", [0, 5, 300])
def test_too_little_audio_still_gives_ordered_timings_inside_it(num_samples: int) -> None:
    text, words = words_of("one two three four five six seven eight")
    pcm = np.zeros(num_samples, dtype=np.float32)
    for audio in (None, pcm):
        timing = estimate_timing(text, words, num_samples, sample_rate=SAMPLE_RATE, pcm=audio)
        assert_well_formed(timing, words, num_samples)


def test_pcm_of_another_length_is_refused() -> None:
    text, words = words_of("hello")
    with pytest.raises(ValueError, match="samples"):
        estimate_timing(text, words, 100, sample_rate=SAMPLE_RATE, pcm=np.zeros(99, np.float32))


TN_CASES = [
    "In 200 m turn left.",
    "前方500元右转",
    "Meet at 3:45 PM today.",
    "Take the I-95 north.",
    "It costs $4.50.",
    "**Step 1:** Open the *Wi-Fi* settings.",
    "Read [the docs](https://example.com/docs) or https://example.com/a now.",
    "请访问 https://example.com/docs 查看详情",
    "1. Turn left.\n2. Continue for 200 m\n- Exit",
]


@pytest.mark.parametrize("text", TN_CASES)
def test_every_spoken_word_of_the_caller_s_text_is_timed_once_inside_its_utterance(
    text: str, normalize: TextNormalizer, chattts_normalizer
) -> None:
    for index, utterance in enumerate(utterances_traced(text, 30.0, 5)):
        spoken = normalize.spoken(utterance, chattts_normalizer)
        words = spoken_words(spoken)
        # A word a burst, a gap between words: audio as speech would have it.
        step = 0.3
        pcm = bursts(
            [(0.1 + i * step, 0.1 + i * step + 0.22) for i in range(len(words))],
            0.2 + len(words) * step,
            index,
        )
        timing = estimate_timing(spoken.text, words, len(pcm), sample_rate=SAMPLE_RATE, pcm=pcm)
        assert_well_formed(timing, words, len(pcm))
        for t in timing.words:
            assert t.span is not None and 0 <= t.span[0] < t.span[1] <= len(text)
            assert t.end_sample > t.start_sample
        spans = [t.span for t in timing.words]
        assert spans == sorted(spans) and len(set(spans)) == len(spans)
        shifted = [t.shifted(1000) for t in timing.words]
        assert [
            s.start_sample - t.start_sample for s, t in zip(shifted, timing.words, strict=True)
        ] == [1000] * len(words)


@settings(max_examples=80, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["a", "cat", "butterfly", "五", "two hundred meters"]),
        min_size=1,
        max_size=12,
    ),
    separators=st.lists(
        st.sampled_from([" ", ", ", ". ", " [uv_break] "]), min_size=12, max_size=12
    ),
    num_samples=st.integers(0, 3 * SAMPLE_RATE),
    gaps=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 0.3)), max_size=6),
    with_pcm=st.booleans(),
)
def test_any_words_and_audio_give_ordered_timings_inside_the_audio(
    words: list[str],
    separators: list[str],
    num_samples: int,
    gaps: list[tuple[float, float]],
    with_pcm: bool,
) -> None:
    text = "".join(w + s for w, s in zip(words, separators, strict=False))
    spoken = spoken_words(Traced.source(text))
    pcm = None
    if with_pcm:
        pcm = np.random.default_rng(0).normal(0, 0.1, num_samples).astype(np.float32)
        for at, length in gaps:  # silent gaps
            i = int(at * num_samples)
            pcm[i : i + int(length * SAMPLE_RATE)] = 0
    timing = estimate_timing(text, spoken, num_samples, sample_rate=SAMPLE_RATE, pcm=pcm)
    assert_well_formed(timing, spoken, num_samples)
    if num_samples >= SAMPLE_RATE // 10 * len(spoken):
        assert all(t.end_sample > t.start_sample for t in timing.words)


def test_heard_until_moves_word_by_word_and_never_past_the_last_word() -> None:
    """Where a client that lost its stream starts again: after the last word wholly heard (by
    the same estimate a CUT stops at), never after the utterance's last word."""
    from chattts_server.timing.timeline import heard_until

    text = "turn left at the next junction"
    spoken = Traced.source(text)
    whole = round(estimate_duration_s(text, 5) * SAMPLE_RATE)
    marks = [heard_until(spoken, n, SAMPLE_RATE, 5) for n in range(0, 2 * whole, whole // 50)]
    assert marks[0] is None
    heard = [m for m in marks if m is not None]
    assert heard == sorted(heard)
    ends = {m for m in heard}
    word_ends = {end for _, end in word_spans(text)}
    assert ends <= word_ends and len(ends) == len(word_ends) - 1
    assert max(heard) == text.rindex(" junction")
