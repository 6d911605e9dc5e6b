"""Alignment heads chosen by monotonicity (timing/calibration.py) and words timed by their
path (timing/attention.py), on attention matrices made to follow a known path."""

from __future__ import annotations

import numpy as np

from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.api.events import to_pb
from chattts_server.stream.items import Speak
from chattts_server.text.spans import Traced
from chattts_server.text.words import spoken_words
from chattts_server.timing.attention import alignment_path, attention_timing, word_steps
from chattts_server.timing.calibration import MIN_SCORE, choose_heads, monotonicity, score_heads
from chattts_server.timing.timeline import word_timings
from chattts_server.timing.types import ATTENTION, TokenAlignment

SAMPLES_PER_TOKEN = 512


def _along(path: list[int], num_tokens: int, seed: int, sharpness: float = 4.0) -> np.ndarray:
    """(steps, tokens) softmax weights peaked on `path`, over noise."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(path), num_tokens))
    logits[np.arange(len(path)), path] += sharpness
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


def _random(steps: int, num_tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = np.exp(rng.normal(size=(steps, num_tokens)))
    return weights / weights.sum(axis=1, keepdims=True)


def _path(durations: list[int]) -> list[int]:
    """Token t attended for durations[t] steps, in order."""
    return [t for t, n in enumerate(durations) for _ in range(n)]


def test_a_monotonic_path_scores_high_and_random_attention_low() -> None:
    path = _path([3, 5, 2, 4, 6, 3, 2, 5])
    assert monotonicity(_along(path, 8, seed=1)) >= MIN_SCORE
    assert all(monotonicity(_random(len(path), 8, seed)) < MIN_SCORE for seed in range(20))
    backwards = list(reversed(path))
    assert monotonicity(_along(backwards, 8, seed=2)) < MIN_SCORE
    stuck = [0] * len(path)  # never leaves the first token: no coverage
    assert monotonicity(_along(stuck, 8, seed=3)) < MIN_SCORE


def test_choose_heads_keeps_the_aligned_head_only() -> None:
    path = _path([4, 3, 6, 2, 5, 4, 3, 3, 4, 2])
    weights = {
        (layer, head): _random(len(path), 10, 10 * layer + head)
        for layer in range(3)
        for head in range(4)
    }
    weights[(1, 2)] = _along(path, 10, seed=7)
    assert choose_heads(score_heads(weights)) == ((1, 2),)
    del weights[(1, 2)]
    assert choose_heads(score_heads(weights)) == ()  # the server serves the estimate


def test_words_recovered_within_one_token_of_the_path() -> None:
    text = "turn left in two hundred meters"
    spoken = Traced.source(text)
    words = spoken_words(spoken)
    # Text tokens: each word split into pieces of up to 3 characters (like word pieces).
    token_chars = [(a, min(a + 3, w.end)) for w in words for a in range(w.start, w.end, 3)]
    rng = np.random.default_rng(5)
    durations = [int(n) for n in rng.integers(2, 7, size=len(token_chars))]
    path = _path(durations)
    weights = [_along(path, len(token_chars), seed=s, sharpness=3.0) for s in (11, 12)]
    found = alignment_path(weights)
    alignment = TokenAlignment(tuple(int(t) for t in found), tuple(token_chars))
    num_samples = len(path) * SAMPLES_PER_TOKEN
    timing = attention_timing(words, alignment, num_samples, SAMPLES_PER_TOKEN)
    assert timing.source == ATTENTION
    assert [w.text for w in timing.words] == [w.text for w in words]
    # Where the path puts each word: from its first token's first step to its last's end.
    starts = np.cumsum([0, *durations])
    for word, timed in zip(words, timing.words, strict=True):
        tokens = [t for t, (a, b) in enumerate(token_chars) if a < word.end and b > word.start]
        true_start, true_end = starts[tokens[0]], starts[tokens[-1] + 1]
        assert abs(timed.start_sample / SAMPLES_PER_TOKEN - true_start) <= 1, word
        assert abs(timed.end_sample / SAMPLES_PER_TOKEN - true_end) <= 1, word
        assert timed.span == word.span
    ends = [w.end_sample for w in timing.words]
    assert all(
        a.end_sample <= b.start_sample for a, b in zip(timing.words, timing.words[1:], strict=False)
    )
    assert max(ends) <= num_samples


def test_a_word_the_path_skips_gets_the_time_between_its_neighbours() -> None:
    words = spoken_words(Traced.source("one two three"))
    token_chars = ((0, 3), (4, 7), (8, 13))
    alignment = TokenAlignment((0, 0, 0, 2, 2), token_chars)
    assert word_steps(words, alignment) == [(0, 3), None, (3, 5)]
    timing = attention_timing(words, alignment, 5 * 10, 10)
    assert [(w.start_sample, w.end_sample) for w in timing.words] == [(0, 30), (30, 30), (30, 50)]


def test_hovering_back_never_makes_words_overlap() -> None:
    words = spoken_words(Traced.source("ab cd"))
    alignment = TokenAlignment((0, 1, 0, 1, 1), ((0, 2), (3, 5)))
    timing = attention_timing(words, alignment, 50, 10)
    (a, b) = timing.words
    assert a.end_sample <= b.start_sample and b.end_sample == 50


def test_the_timeline_sends_the_alignment_as_timing_model_attention() -> None:
    """An utterance that finished with its alignment: its words on the stream's timeline from
    it (half the rate here), with the caller's spans, sent as TIMING_MODEL_ATTENTION; without
    one, and when cut, the estimate."""
    caller = "turn left now"
    spoken = Traced.source(caller, offset=100)
    item = Speak.of(spoken, caller, offset=100)
    alignment = TokenAlignment((0, 0, 0, 1, 1, 2, 2, 2), ((0, 4), (5, 9), (10, 13)))
    pcm = np.zeros(8 * SAMPLES_PER_TOKEN, dtype=np.float32)
    common = dict(native_rate=24000, speed=5, stream_offset=1000, stream_rate=12000)
    event = word_timings(
        3,
        item,
        spoken,
        pcm,
        cut=False,
        stream_samples=4 * SAMPLES_PER_TOKEN,
        alignment=alignment,
        samples_per_token=SAMPLES_PER_TOKEN,
        **common,
    )
    half = SAMPLES_PER_TOKEN // 2
    assert [(w.start_sample, w.end_sample) for w in event.words] == [
        (1000, 1000 + 3 * half),
        (1000 + 3 * half, 1000 + 5 * half),
        (1000 + 5 * half, 1000 + 8 * half),
    ]
    assert [(w.source_span, w.source_text) for w in event.words] == [
        ((100, 104), "turn"),
        ((105, 109), "left"),
        ((110, 113), "now"),
    ]
    assert to_pb(event).source == tts_pb2.TIMING_MODEL_ATTENTION
    for kwargs in ({"cut": False}, {"cut": True, "alignment": alignment}):
        estimated = word_timings(
            3, item, spoken, pcm, stream_samples=4 * SAMPLES_PER_TOKEN, **common, **kwargs
        )
        assert to_pb(estimated).source == tts_pb2.TIMING_ESTIMATE
