"""The alignment heads chosen at warm-up: one calibration sentence spoken greedily with every
head's attention over its text captured, each head scored by monotonicity
(`model/alignment_heads.py`). The runner then captures the chosen heads for every audio pass
and word timing comes from them (TIMING_MODEL_ATTENTION); with none (the random dev weights)
the server serves the estimate, and says which in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ..model.alignment_calibration import head_weights
from ..model.alignment_heads import MIN_SCORE, HeadId, choose_heads, score_heads
from ..model.kv_cache import SlotKVCache
from ..model.llama import LlamaDecoder
from ..text.duration import estimate_duration_s
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
    decoder: LlamaDecoder,
    cache: SlotKVCache,
    prompts: PromptBuilder,
    next_embed: Callable[[torch.Tensor], torch.Tensor],
    tokens_per_s: float,
) -> tuple[HeadId, ...]:
    """The heads whose argmax over the calibration sentence's text is monotonic (best first),
    decoding as many steps as the duration model gives the sentence; () when none qualifies."""
    text = prompts.normalize(CALIBRATION_TEXT)
    prompt = prompts.code_prompt(text, VoiceSpec(), CALIBRATION_SPEED)
    if prompt.text_tokens is None:
        log.info("alignment heads: none (the calibration prompt's text tokens were not found)")
        return ()
    embeds = prompt.embeds.to(decoder.norm.dtype)
    steps = round(estimate_duration_s(text, CALIBRATION_SPEED) * tokens_per_s)
    steps = min(steps, MAX_STEPS, cache.kv.shape[4] - embeds.shape[0])
    hidden = decoder.prefill(CALIBRATION_SLOT, embeds, 0, cache)
    weights = head_weights(
        decoder, cache, CALIBRATION_SLOT, hidden, prompt.text_tokens.positions, next_embed, steps
    )
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
