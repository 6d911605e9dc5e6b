"""Word timing from the model's own alignment: the audio steps whose attention falls on a word.

The GPT's alignment heads (chosen by `timing/calibration.py`) give, for each audio token, the
text token they attend to most (`alignment_path`, the runner's `timing/alignment.py`). A word
starts at the first audio token whose text token lies in the word and ends after the last one;
words the path skips get the time between their neighbours. Text tokens are mapped to the
spoken text's characters (`TokenAlignment.token_chars`) and words carry their caller spans from
`words.spoken_words`, as the estimate does.

    timing = attention_timing(spoken_words(spoken), alignment, len(pcm), samples_per_token)
    timing.source  # "attention"
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..text.words import SpokenWord
from .types import ATTENTION, TokenAlignment, UtteranceTiming, WordTiming


def alignment_path(weights: Sequence[np.ndarray]) -> np.ndarray:
    """The text token each audio step attends to most, over the chosen heads' weights averaged:
    `weights` holds one (steps, text tokens) matrix per head -> (steps,) int."""
    return np.mean(np.stack(weights), axis=0).argmax(axis=1)


def word_steps(
    words: Sequence[SpokenWord], alignment: TokenAlignment
) -> list[tuple[int, int] | None]:
    """Per word, [first, last + 1) of the audio tokens whose text token overlaps it; None for a
    word no audio token attends to."""
    path = np.asarray(alignment.path, dtype=np.int64)
    out: list[tuple[int, int] | None] = []
    for word in words:
        tokens = [
            t for t, (a, b) in enumerate(alignment.token_chars) if a < word.end and b > word.start
        ]
        steps = np.flatnonzero(np.isin(path, tokens)) if tokens else np.zeros(0, np.int64)
        out.append((int(steps[0]), int(steps[-1]) + 1) if len(steps) else None)
    return out


def attention_timing(
    words: Sequence[SpokenWord],
    alignment: TokenAlignment,
    num_samples: int,
    samples_per_token: int,
) -> UtteranceTiming:
    """`words` placed in an utterance of `num_samples` samples by `alignment`, each audio token
    `samples_per_token` long: in order, without overlap (a word starts no earlier than the one
    before it ends), inside the audio."""
    steps = word_steps(words, alignment)
    num_steps = len(alignment.path)
    bounds: list[tuple[int, int]] = []
    at = 0
    for i, found in enumerate(steps):
        if found is None:
            # Skipped by the path: the time up to the next word the path reaches.
            nxt = next((s[0] for s in steps[i + 1 :] if s is not None), num_steps)
            first, last = at, max(at, nxt)
        else:
            first = max(at, found[0])
            last = max(first, found[1])
        bounds.append((first, last))
        at = last
    out = []
    for word, (first, last) in zip(words, bounds, strict=True):
        start = min(num_samples, first * samples_per_token)
        end = min(num_samples, last * samples_per_token)
        out.append(WordTiming(word.text, word.span, start, end))
    return UtteranceTiming(ATTENTION, tuple(out))
