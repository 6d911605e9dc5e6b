"""Which attention heads of the GPT align audio to text: chosen once, when the GPT is built.

Some heads of a TTS decoder attend, from each audio step, to the text token being spoken, so
their argmax walks forward through the text (Whisper's alignment heads, chatterbox's
`AlignmentStreamAnalyzer`). One calibration sentence is spoken greedily with every head's
attention over its text captured (`timing/capture.py`), and the heads whose argmax path is
monotonic and covers the text are kept (`monotonicity`, `choose_heads`). The runner then
captures the chosen heads for every audio pass and word timing comes from them
(`timing/attention.py`, TIMING_MODEL_ATTENTION); with none (the random dev weights) the server
serves the estimate (`timing/estimate.py`), and says which in the log. The same on every
backend that can read attention (`GPTModel.forward`'s capture: torch, or llama.cpp's eval
callback).

The scoring is pure numpy over (steps, text tokens) weight matrices, tested without a model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from ..model.llama import DecodeBatch, PromptRun
from ..model.llama_layers import LlamaShape
from ..text.duration import estimate_duration_s
from .capture import AttentionWeights
from .types import CaptureRequest, CaptureRow, HeadId, PromptText

log = logging.getLogger(__name__)

CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog."
"""Plain English the model reads straight (no numbers for the normalizer to expand), short:
its ~180 decode steps are added to every warm-up."""
MAX_STEPS = 240
"""Calibration decodes no more than this (a slow `[speed_N]` estimate would run longer)."""
CALIBRATION_SPEED = 5
CALIBRATION_SLOT = 0
"""Warm-up runs before any request, so every slot is free."""
MIN_SCORE = 0.75
"""A head qualifies when its `monotonicity` reaches this: e.g. 95% of its steps never go back,
its path visits 90% of the text tokens and follows the text with correlation 0.9. Random
attention scores below 0.3."""
MAX_HEADS = 4
"""The best heads kept (their weights are averaged per step)."""
MAX_BACKSTEP = 1
"""A step back of at most this many tokens is not counted as going back (heads that hover
between two neighbouring tokens are still aligned)."""


class SpeakingGPT(Protocol):
    """What calibration drives: the GPT as the runner has it (`engine/gpt.GPTModel`)."""

    shape: LlamaShape

    def forward(
        self,
        prompts: list[PromptRun],
        decode: DecodeBatch | None,
        alignment: CaptureRequest | None = None,
    ) -> tuple[list[Tensor], Tensor | None, AttentionWeights | None]: ...

    def free_slot(self, slot_id: int) -> None: ...

    @property
    def decode_graphs(self) -> str: ...


class CodePrompt(Protocol):
    """An audio-code prompt (`engine/prompts.Prompt`)."""

    embeds: Tensor
    text: str
    text_tokens: PromptText | None


PromptFor = Callable[[str, int], CodePrompt]
"""(text, speed) -> the audio-code prompt of `text`, normalized, in the default voice."""


def monotonicity(weights: np.ndarray) -> float:
    """How well one head's argmax path (audio step -> text token) aligns: the share of steps
    that do not go back (by more than `MAX_BACKSTEP`), times the share of text tokens the path
    visits, times how steadily it moves forward (the correlation of token with step, 0 when
    negative: a path that hovers back one token at a time is not aligned). `weights` is
    (steps, text tokens); 0.0 for fewer than two steps or tokens."""
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


@torch.inference_mode()
def calibrate_alignment_heads(
    gpt: SpeakingGPT,
    prompt_for: PromptFor,
    next_embed: Callable[[Tensor], Tensor],
    tokens_per_s: float,
    max_tokens: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[HeadId, ...]:
    """The heads whose argmax over the calibration sentence's text is monotonic (best first),
    decoding as many steps as the duration model gives the sentence; () when none qualifies
    or `gpt` cannot read attention. `dtype`: the GPT's input dtype."""
    prompt = prompt_for(CALIBRATION_TEXT, CALIBRATION_SPEED)
    if prompt.text_tokens is None:
        log.info("alignment heads: none (the calibration prompt's text tokens were not found)")
        return ()
    steps = round(estimate_duration_s(prompt.text, CALIBRATION_SPEED) * tokens_per_s)
    steps = min(steps, MAX_STEPS, max_tokens - prompt.embeds.shape[0])
    embeds = prompt.embeds.to(dtype)
    weights = head_weights(gpt, embeds, prompt.text_tokens.positions, next_embed, steps)
    scores = score_heads(weights)
    chosen = choose_heads(scores)
    best = max(scores.items(), key=lambda kv: kv[1], default=None)
    if chosen:
        log.info(
            "word timing: source attention, heads %s (monotonicity %s over %d steps)",
            chosen,
            ", ".join(f"{scores[h]:.2f}" for h in chosen),
            steps,
        )
    else:
        log.info(
            "word timing: source estimate, no attention head aligns (best %s scores %.2f < %.2f "
            "over %d steps)",
            best[0] if best else None,
            best[1] if best else 0.0,
            MIN_SCORE,
            steps,
        )
    return chosen


@torch.inference_mode()
def head_weights(
    gpt: SpeakingGPT,
    prompt: Tensor,
    text: tuple[int, int],
    next_embed: Callable[[Tensor], Tensor],
    steps: int,
) -> dict[HeadId, np.ndarray]:
    """(steps, text tokens) weights of every head while `gpt` speaks `prompt` (L, D) from a
    free slot, whose positions [text[0], text[1]) are the text: `steps` decode steps, the input
    of each `next_embed(last hidden state (D,)) -> (D,)`. {} where attention cannot be read."""
    shape = gpt.shape
    heads = tuple(
        (layer, head) for layer in range(shape.num_layers) for head in range(shape.num_heads)
    )
    rows = [CaptureRow(0, CALIBRATION_SLOT, text[0], text[1])]
    gpt.free_slot(CALIBRATION_SLOT)
    last, _, _ = gpt.forward([PromptRun(CALIBRATION_SLOT, prompt, 0)], None)
    hidden, position = last[0], prompt.shape[0]
    slots = torch.tensor([CALIBRATION_SLOT], device=prompt.device)
    found: list[Tensor] = []
    order: list[HeadId] = []
    for _ in range(steps):
        embed = next_embed(hidden).to(prompt.dtype)[None]
        decode = DecodeBatch(slots, embed, torch.tensor([position], device=prompt.device))
        _, out, capture = gpt.forward([], decode, (heads, rows))
        if capture is None:
            break
        assert out is not None
        hidden, order = out[0], capture.order
        found.append(capture.row_weights(0).float().cpu())
        position += 1
    gpt.free_slot(CALIBRATION_SLOT)
    if not found:
        return {}
    weights = torch.stack(found, dim=1).numpy()  # (heads, steps, text tokens)
    return {head: weights[i] for i, head in enumerate(order)}
