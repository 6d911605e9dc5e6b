"""Which attention heads of the GPT align audio to text, and the alignment they give.

Some heads of a TTS decoder attend, from each audio step, to the text token being spoken, so
their argmax walks forward through the text (Whisper's alignment heads, chatterbox's
`AlignmentStreamAnalyzer`). At load the server runs one calibration sentence, captures every
head's attention from its audio steps over the text tokens (`model/alignment_capture.py`) and
keeps the heads whose argmax path is monotonic and covers the text (`monotonicity`,
`choose_heads`). With them, each utterance's path (`alignment_path`) times its words
(`text/attention_timing.py`). Random weights (the dev model) give no such head: the server then
serves the estimate (`text/timing.py`).

Pure numpy over (steps, text tokens) weight matrices, so the scoring is tested without a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

HeadId = tuple[int, int]
"""(layer, head)."""

MIN_SCORE = 0.75
"""A head qualifies when its `monotonicity` reaches this: e.g. 95% of its steps never go back,
its path visits 90% of the text tokens and follows the text with correlation 0.9. Random
attention scores below 0.3."""
MAX_HEADS = 4
"""The best heads kept (their weights are averaged per step)."""
MAX_BACKSTEP = 1
"""A step back of at most this many tokens is not counted as going back (heads that hover
between two neighbouring tokens are still aligned)."""


def monotonicity(weights: np.ndarray) -> float:
    """How well one head's argmax path (audio step -> text token) aligns: the share of steps
    that do not go back (by more than `MAX_BACKSTEP`), times the share of text tokens the path
    visits, times how steadily it moves forward (the correlation of token with step, 0 when
    negative: a path that hovers back one token at a time is not aligned). `weights` is (steps, text tokens); 0.0 for fewer than two steps or tokens."""
    steps, num_tokens = weights.shape
    if steps < 2 or num_tokens < 2:
        return 0.0
    path = weights.argmax(axis=1)
    forward = float(np.mean(np.diff(path) >= -MAX_BACKSTEP))
    if np.all(path == path[0]):
        return 0.0
    trend = float(np.corrcoef(np.arange(steps), path)[0, 1])
    coverage = len(np.unique(path)) / num_tokens
    return forward * min(1.0, coverage) * max(0.0, trend)


def choose_heads(
    scores: Mapping[HeadId, float], threshold: float = MIN_SCORE, max_heads: int = MAX_HEADS
) -> tuple[HeadId, ...]:
    """The heads scoring at least `threshold`, best first (ties by layer, head), at most
    `max_heads`; () when none qualifies."""
    ranked = sorted((h for h, s in scores.items() if s >= threshold), key=lambda h: (-scores[h], h))
    return tuple(ranked[:max_heads])


def score_heads(weights: Mapping[HeadId, np.ndarray]) -> dict[HeadId, float]:
    """`monotonicity` of each head's (steps, text tokens) weights."""
    return {head: monotonicity(w) for head, w in weights.items()}


def alignment_path(weights: Sequence[np.ndarray]) -> np.ndarray:
    """The text token each audio step attends to most, over the chosen heads' weights averaged:
    `weights` holds one (steps, text tokens) matrix per head -> (steps,) int."""
    return np.mean(np.stack(weights), axis=0).argmax(axis=1)
