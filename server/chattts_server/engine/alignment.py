"""The alignment heads chosen when the GPT is built: one calibration sentence spoken greedily
with every head's attention over its text captured, each head scored by monotonicity
(`model/alignment_heads.py`). The runner then captures the chosen heads for every audio pass
and word timing comes from them (TIMING_MODEL_ATTENTION); with none (the random dev weights)
the server serves the estimate, and says which in the log. The same on every backend that can
read attention (`GPTModel.forward`'s capture: torch, or llama.cpp's eval callback).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ..model.alignment_capture import CaptureRow
from ..model.alignment_heads import MIN_SCORE, HeadId, choose_heads, score_heads
from ..model.llama import DecodeBatch, PromptRun
from ..text.duration import estimate_duration_s
from .gpt import GPTModel
from .prompts import PromptBuilder
from .utterance import VoiceSpec

log = logging.getLogger(__name__)

CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog."
"""Plain English the model reads straight (no numbers for the normalizer to expand), short:
its ~180 decode steps are added to every warm-up."""
MAX_STEPS = 240
"""Calibration decodes no more than this (a slow `[speed_N]` estimate would run longer)."""
CALIBRATION_SPEED = 5
CALIBRATION_SLOT = 0
"""Warm-up runs before any request, so every slot is free."""


@torch.inference_mode()
def calibrate_alignment_heads(
    gpt: GPTModel,
    prompts: PromptBuilder,
    next_embed: Callable[[Tensor], Tensor],
    tokens_per_s: float,
    max_tokens: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[HeadId, ...]:
    """The heads whose argmax over the calibration sentence's text is monotonic (best first),
    decoding as many steps as the duration model gives the sentence; () when none qualifies
    or `gpt` cannot read attention. `dtype`: the GPT's input dtype."""
    text = prompts.normalize(CALIBRATION_TEXT)
    prompt = prompts.code_prompt(text, VoiceSpec(), CALIBRATION_SPEED)
    if prompt.text_tokens is None:
        log.info("alignment heads: none (the calibration prompt's text tokens were not found)")
        return ()
    steps = round(estimate_duration_s(text, CALIBRATION_SPEED) * tokens_per_s)
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
    gpt: GPTModel,
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
