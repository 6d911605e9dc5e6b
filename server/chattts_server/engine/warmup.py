"""Warm-up: every code path once before health reports SERVING, so that no request pays for a
first call (lazy allocations, ChatTTS's numba normalizer compiling, llama.cpp's first graph).
What the GPT needed measured (its format, its alignment heads, its CUDA graphs) was settled when
it was built (`engine/gpt_build.py`).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import torch

from ..model.llama import DecodeBatch, PromptRun
from .gpt import GPTModel, decode_batch_sizes
from .heads import Heads
from .prompts import PromptBuilder
from .streaming_decode import StreamingDecoder
from .utterance import VoiceSpec

log = logging.getLogger(__name__)


class Warmable(Protocol):
    """What warm-up runs: `engine/runner.ModelRunner`'s parts."""

    prompts: PromptBuilder
    gpt: GPTModel
    heads: Heads
    audio: StreamingDecoder
    device: torch.device
    dtype: torch.dtype


@torch.inference_mode()
def warm_up(runner: Warmable, batch_size: int) -> None:
    """The prompt builder, a prefill, a decode step at each batch size the scheduler will use
    (powers of two up to `batch_size`, and `batch_size`) with the heads, and the streaming
    Decoder + vocoder."""
    started = time.monotonic()
    runner.prompts.code_prompt(
        runner.prompts.normalize("Warm up [uv_break] in 2 minutes, please!"), VoiceSpec(), 5
    )
    sizes = decode_batch_sizes(batch_size)
    gpt, device, dtype = runner.gpt, runner.device, runner.dtype
    d = gpt.shape.hidden_size
    gpt.forward([PromptRun(0, torch.zeros(16, d, device=device, dtype=dtype), 0)], None)
    for size in sizes:
        for slot in range(size):  # each step a fresh position 0 (llama.cpp wants them in order)
            gpt.free_slot(slot)
        slots = torch.arange(size, device=device)
        positions = torch.zeros(size, dtype=torch.long, device=device)
        zeros = torch.zeros(size, d, device=device, dtype=dtype)
        _, hidden, _ = gpt.forward([], DecodeBatch(slots, zeros, positions, max_position=0))
        assert hidden is not None
        runner.heads.code_logits(hidden)
    for slot in range(max(sizes)):
        gpt.free_slot(slot)
    stream = runner.audio.open()
    stream.push(torch.zeros(24, d, device=device))
    runner.audio.finish({0: stream})
    if device.type == "cuda":
        torch.cuda.synchronize()
    log.info("warm-up (decode batches %s) took %.2f s", sizes, time.monotonic() - started)
