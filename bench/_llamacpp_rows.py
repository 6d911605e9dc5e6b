"""bench_decode_step.py's llama.cpp rows: the same decode step (B rows at mixed positions around
`context`) on the server's llama.cpp backend (engine/llamacpp_gpt.py), one row per GGUF format,
with its floor (GGUF weights plus live K/V over the probe's bandwidth) and the FLOP rate of a
batch-B step beside the rate of a large prefill in the same runtime."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.engine.llamacpp_gpt import LlamaCppGPT
from chattts_server.model.autotune import snr_db
from chattts_server.model.gguf_export import GGUFCache
from chattts_server.model.llama import DecodeBatch, PromptRun
from chattts_server.model.llama_layers import LlamaShape

PREFILL_TOKENS = 512


@dataclass
class LlamaCppRow:
    weight_format: str
    gpt: LlamaCppGPT
    weight_bytes: int
    kv_bytes_per_token: int
    snr_db: float
    prefill_gflops: float = 0.0


def linear_flops_per_token(shape: LlamaShape) -> int:
    """Multiply-adds x 2 of the linear layers for one token (attention's are extra)."""
    d, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    per_layer = d * (d + 2 * kv) + d * d + 3 * d * shape.intermediate_size
    return 2 * per_layer * shape.num_layers


def build_rows(
    model: LlamaModel,
    config: LlamaConfig,
    formats: list[str],
    slots: int,
    max_tokens: int,
    threads: int,
    probe: torch.Tensor,
    reference: torch.Tensor,
) -> list[LlamaCppRow]:
    """One llama.cpp context per format, its SNR on `probe` against fp32 `reference`."""
    shape = LlamaShape.from_config(config)
    folder = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    cache = GGUFCache(folder, "bench")
    state = model.state_dict()
    rows = []
    for fmt in formats:
        path = cache.get(fmt, state, shape, float(config.rope_theta), threads)
        gpt = LlamaCppGPT(path, shape, slots, max_tokens, PREFILL_TOKENS, threads, fmt)
        kv_element = 4 if fmt == "F32" else 2
        kv_per_token = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * kv_element
        snr = snr_db(reference, gpt.hidden_states(0, probe))
        rows.append(LlamaCppRow(fmt, gpt, path.stat().st_size, kv_per_token, snr))
    return rows


def prefill_gflops(row: LlamaCppRow, shape: LlamaShape, repeats: int = 2) -> float:
    """The FLOP rate of a PREFILL_TOKENS-token prompt (the runtime's large-GEMM speed)."""
    x = torch.zeros(PREFILL_TOKENS, shape.hidden_size)
    best = float("inf")
    for _ in range(repeats):
        row.gpt.free_slot(0)
        started = time.perf_counter()
        row.gpt.forward([PromptRun(0, x, 0)], None)
        best = min(best, time.perf_counter() - started)
    row.gpt.free_slot(0)
    return linear_flops_per_token(shape) * PREFILL_TOKENS / best / 1e9


def decode_step(row: LlamaCppRow, positions: list[int]) -> Callable[[], object]:
    """A step of len(positions) rows, each sequence prefilled to its position; the step's
    position is removed after it, so every timed step sees the same context."""
    gpt = row.gpt
    d = gpt.shape.hidden_size
    batch = len(positions)
    for slot in range(gpt.num_slots):
        gpt.free_slot(slot)
    gpt.forward([PromptRun(s, torch.zeros(p, d), 0) for s, p in enumerate(positions)], None)
    decode = DecodeBatch(
        torch.arange(batch), torch.zeros(batch, d), torch.tensor(positions), max(positions)
    )
    lc, memory = gpt._lc, gpt._memory

    def step() -> None:
        gpt.forward([], decode)
        for slot, pos in enumerate(positions):
            lc.llama_memory_seq_rm(memory, slot, pos, -1)

    return step
