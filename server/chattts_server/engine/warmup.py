"""Warm-up: every code path once before health reports SERVING, and what is measured there.

Measured on the machine itself, because what wins on one CPU loses on another: the linear mode
of each decode batch size (autotune, lossy modes only within the quality budget), whether the
compiled decode step pays, the CUDA graphs, and the attention heads that time words. Answers are
kept per machine, weights and torch version (`model/autotune_cache.py`): a restart reuses them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from ..model.alignment_heads import MIN_SCORE, HeadId
from ..model.autotune_cache import tune_or_reuse, weights_digest
from ..model.compiled_decode import tune_compiled
from ..model.kv_cache import SlotKVCache
from ..model.llama import DecodeBatch, LlamaDecoder, PromptRun
from .alignment import CALIBRATION_TEXT, calibrate_alignment_heads
from .backend_choice import choose_backend
from .gpt import decode_batch_sizes
from .utterance import VoiceSpec

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger(__name__)


@torch.inference_mode()
def warm_up(runner: ModelRunner, batch_size: int) -> None:
    """The prompt builder (its first call JIT-compiles ChatTTS's numba normalizer), autotune,
    the compiled step and the graphs, prefill, decode at each batch size the scheduler will
    use (powers of two up to `batch_size`, and `batch_size`), the heads, the streaming Decoder
    + vocoder, and the alignment heads."""
    started = time.monotonic()
    probe = runner.prompts.code_prompt(
        runner.prompts.normalize("Warm up [uv_break] in 2 minutes, please!"), VoiceSpec(), 5
    )
    sizes = decode_batch_sizes(batch_size)
    embeds = probe.embeds.to(runner.dtype)
    reference = fp32_reference(runner, embeds)  # before autotune frees the lossless weights
    _tune_torch(runner, sizes, embeds)
    choice = choose_backend(runner, sizes, embeds, reference)
    if choice.backend == "llamacpp":
        runner.gpt = runner.build_llamacpp(choice.weight_format)
        runner.torch_gpt = None  # its weights and K/V cache go: llama.cpp serves
    runner.modules.gpt_state_dict.clear()  # the GGUF files are written
    _run_every_path(runner, sizes)
    runner.alignment_heads = calibrate_alignment(runner)
    if runner.device.type == "cuda":
        torch.cuda.synchronize()
    log.info("warm-up (decode batches %s) took %.2f s", sizes, time.monotonic() - started)


def fp32_reference(runner: ModelRunner, probe: torch.Tensor) -> torch.Tensor | None:
    """The probe's hidden states in fp32 (plain `F.linear` on the loaded weights, fp32 K/V):
    what a llama.cpp format is held against, whatever `--quantize` built for torch. None where
    no other backend competes."""
    if runner.backend.backend == "torch" or runner.device.type != "cpu":
        return None
    modules = runner.modules
    dense = LlamaDecoder.from_state_dict(  # shares the weights' storage: nothing is copied
        modules.gpt_config, modules.gpt_state_dict, runner.device, torch.float32, modes=["dense"]
    )
    cache = SlotKVCache(dense.shape, 1, probe.shape[0], runner.device, torch.float32)
    return dense.prefill(0, probe.float(), 0, cache).float()


def _tune_torch(runner: ModelRunner, sizes: list[int], probe: torch.Tensor) -> None:
    """Our forward's linear mode per batch size, the compiled step and the CUDA graphs."""
    gpt = runner.torch_gpt
    assert gpt is not None
    autotune_cache = runner.warmup_cache if len(gpt.llama.modes) > 1 else None
    tune_or_reuse(gpt.llama, sizes, gpt.cache, probe, autotune_cache, runner.weights_digest)
    # The decode step as one compiled graph where that measured faster (CPU; bounded).
    tune_compiled(gpt.llama, sizes, gpt.cache, runner.compile_step, runner.compile_budget_s)
    if gpt.graphs is not None:
        try:
            gpt.graphs.capture_all()  # after autotune: each graph bakes in its size's mode
        except Exception as exc:  # noqa: BLE001 - graphs only speed decoding up
            gpt.drop_graphs(exc)


def _run_every_path(runner: ModelRunner, sizes: list[int]) -> None:
    """A prefill, a decode step at each batch size with the heads, and the Decoder + vocoder,
    through the backend that serves."""
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


def calibrate_alignment(runner: ModelRunner) -> tuple[HeadId, ...]:
    """The alignment heads, from one calibration sentence (`engine/alignment.py`); none with
    CUDA graphs (their replayed decode cannot capture attention)."""
    gpt = runner.torch_gpt
    if gpt is None:
        log.info("alignment heads: not calibrated (%s returns no attention)", runner.gpt.name)
        return ()
    if gpt.graphs is not None:
        log.info("alignment heads: not calibrated (CUDA graphs replay the decode step)")
        return ()
    store = runner.warmup_cache.with_prefix("alignment") if runner.warmup_cache else None
    key = {
        "format": 1,
        "gpt": runner.weights_digest,
        "embed": weights_digest(runner.modules.embed.state_dict()),
        "device": runner.device.type,
        "dtype": str(runner.dtype),
        "kv_dtype": str(gpt.llama.kv_dtype),
        "calibration": CALIBRATION_TEXT,
        "min_score": MIN_SCORE,
    }
    cached = store.load_json(key) if store is not None else None
    if store is not None and isinstance(cached, list):
        heads = tuple((int(layer), int(head)) for layer, head in cached)
        source = "attention, heads " + str(heads) if heads else "estimate"
        log.info("word timing: source %s (reused %s)", source, store.path_for(key))
        return heads
    info = runner.info
    heads = calibrate_alignment_heads(
        gpt.llama,
        gpt.cache,
        runner.prompts,
        runner.heads.greedy_code_embed,
        info.sample_rate / info.samples_per_token,
    )
    if store is not None:
        store.store_json(key, [list(head) for head in heads])
    return heads
