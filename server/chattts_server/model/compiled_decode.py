"""The CPU decode step with each layer compiled by ``torch.compile`` (inductor's C++ backend):
a layer's norms, rotary, casts, K/V write, attention and residual adds fused into a few C++
kernels around its linear kernels, instead of ~35 eager ops.

One graph serves every layer (the weights are its inputs; the layer index is a tensor), so
compiling costs one layer's trace, not twenty; a graph of the whole 20-layer step took several
times as long to compile on a loaded 2-core machine. There are two graphs per linear mode: batch
1 (torch specialises sizes of 1) and any larger batch; the attended length is symbolic in both.
Warm-up compiles them (:func:`tune_compiled`); after that a call whose guards fail runs eagerly
instead of compiling while serving (``eager_on_recompile``).

What it covers: decode batches (any slot layout: each row's K/V is read through its slot id) in
every linear mode. Inductor calls the oneDNN and dynamic-int8 kernels through ops that
``linear_modes`` defines (it lowers oneDNN linears only for frozen weights, and a graph cannot
hold the packed int8 weight, a TorchScript object). Prefill and mixed steps stay eager.
Attention is written out (scores, masked softmax, weighted sum of values) for inductor to fuse;
it matches ``scaled_dot_product_attention`` to fp32 rounding. The K/V write indexes the whole
cache tensor: a write through the view ``kv[layer]`` was functionalized into a copy of that
layer's K/V on every call.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from .kv_cache import SlotKVCache
from .llama_layers import Layer, LlamaShape, q_kv, rms_norm

if TYPE_CHECKING:
    from .llama import LlamaDecoder

__all__ = ["CompileResult", "CompiledDecode", "compilable", "set_inductor_cache", "tune_compiled"]

log = logging.getLogger(__name__)

_MAX_GRAPHS = 64
"""Graphs of the layer step warm-up may compile (2 batch classes x modes x layer kinds)."""


def set_inductor_cache(path: Path) -> None:
    """Have inductor keep its compiled kernels and graphs in ``path`` (a restart reuses them:
    seconds instead of a minute). An explicit TORCHINDUCTOR_CACHE_DIR wins."""
    path.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path))


def compilable(decoder: LlamaDecoder, mode: str) -> bool:
    """Whether ``mode``'s kernels trace into the layer graph (every mode built here does:
    the oneDNN and dynamic-int8 kernels through ops of ``linear_modes``)."""
    return mode in decoder.modes


def _attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q (B, H, hd), keys/values (B, H, T, hd), mask (B, 1, T) -> (B, H * hd) in fp32, as
    ``scaled_dot_product_attention`` with a boolean mask (written out for inductor to fuse)."""
    scores = (q.float()[:, :, None, :] * keys.float()).sum(-1) * scale  # (B, H, T)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    out = (probs[..., None] * values.float()).sum(-2)  # (B, H, hd)
    return out.reshape(q.shape[0], -1)


def _layer_step(shape: LlamaShape) -> Callable[..., Tensor]:
    """One layer of the decode step for ``shape`` (its sizes are constants of the graph, so
    inductor's loops have fixed trip counts and vectorize)."""
    group = shape.num_heads // shape.num_kv_heads
    scale = shape.head_dim**-0.5

    def layer_step(
        layer: Layer,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        rows: tuple[Tensor, Tensor, Tensor],
        key_pos: Tensor,
        kv: Tensor,
        mode: str,
    ) -> Tensor:
        """x (B, D) -> x (B, D). ``rope``: (cos, sin) (B, 1, hd); ``rows``: (the layer's
        index repeated (B,), slot ids (B,), positions (B,)); ``key_pos``: 0..T-1, the
        positions attended; ``kv``: the whole SlotKVCache tensor, written in place. Each row's
        K/V is read through its slot id inside the fused attention kernel (no gathered copy).
        """
        layer_index, slot_ids, positions = rows
        attend_len = key_pos.shape[0]
        q, new_kv = q_kv(shape, layer, x, rope[0], rope[1], mode)
        # Indexing the whole tensor (not the view kv[i]) keeps this an in-place scatter into
        # the cache; a write through a view is functionalized into a copy of the layer's K/V.
        kv[layer_index, :, slot_ids, :, positions] = new_kv.to(kv.dtype)
        keys = kv[layer_index, 0, slot_ids, :, :attend_len]  # (B, kv_heads, T, hd)
        values = kv[layer_index, 1, slot_ids, :, :attend_len]
        if group > 1:
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
        mask = (key_pos[None, :] <= positions[:, None])[:, None]  # (B, 1, T)
        x = x + layer.o(_attend(q, keys, values, mask, scale), mode)[0]
        return x + layer.mlp(x, mode)

    return layer_step


class CompiledDecode:
    """The compiled decode step of one decoder and the decode batch sizes it serves.

    ``sizes`` is a table like the decoder's mode table: a batch of B rows runs compiled when
    the smallest warm-up size >= B (the largest beyond them) was chosen for it."""

    def __init__(self, decoder: LlamaDecoder) -> None:
        self.decoder = decoder
        self._layer = torch.compile(_layer_step(decoder.shape))
        self._key_pos = torch.arange(decoder.shape.max_positions, device=decoder.norm.device)
        self.sizes: dict[int, bool] = {}
        """Warm-up batch size -> whether it runs compiled."""
        self._compilable: dict[str, bool] = {}
        self.on_miss = "eager_on_recompile"
        """torch.compiler stance for a call whose guards fail: run it eagerly rather than
        compile while serving (tests set 'fail_on_recompile' to catch a miss)."""

    def covers(self, num_rows: int, mode: str) -> bool:
        """Whether a decode batch of ``num_rows`` rows in ``mode`` runs compiled."""
        if not self.sizes:
            return False
        size = next((b for b in sorted(self.sizes) if b >= num_rows), max(self.sizes))
        if mode not in self._compilable:
            self._compilable[mode] = compilable(self.decoder, mode)
        return self.sizes[size] and self._compilable[mode]

    def run(
        self, slot_ids: Tensor, embeds: Tensor, positions: Tensor, cache: SlotKVCache, mode: str
    ) -> Tensor:
        """The decode step (as ``LlamaDecoder.decode``), each layer through the compiled
        graph. A guard that fails (a shape warm-up did not see) runs it eagerly instead of
        compiling while serving."""
        with torch.compiler.set_stance(self.on_miss):
            return self._step(slot_ids, embeds, positions, cache.kv, mode)

    def _step(
        self,
        slot_ids: Tensor,
        x: Tensor,
        positions: Tensor,
        kv: Tensor,
        mode: str,
        mark_dynamic: bool = False,
    ) -> Tensor:
        d = self.decoder
        key_pos = self._key_pos[: int(positions.max()) + 1]
        rope = (d.rope_cos[positions][:, None], d.rope_sin[positions][:, None])
        layer_index = torch.zeros_like(slot_ids)
        for i, layer in enumerate(cast("list[Layer]", d.layers)):
            rows = (layer_index + i, slot_ids, positions)
            if mark_dynamic:  # compiling: the graph takes any length (and batch of 2 or more)
                torch._dynamo.mark_dynamic(key_pos, 0)
                for t in (x, *rope, *rows) if len(x) > 1 else ():
                    torch._dynamo.mark_dynamic(t, 0)
            x = self._layer(layer, x, rope, rows, key_pos, kv, mode)
        return rms_norm(x, d.norm, d.shape.rms_norm_eps)

    def compile_for(self, cache: SlotKVCache, batch: int, mode: str) -> float:
        """Compile (or load from inductor's cache) the graph a decode batch of ``batch`` rows
        in ``mode`` runs (one serves every batch of two rows or more, at any length). Writes
        garbage K/V into slots 0..batch-1. Returns the seconds it took."""
        started = time.perf_counter()
        device = cache.kv.device
        x = torch.zeros(
            batch, self.decoder.shape.hidden_size, device=device, dtype=self.decoder.norm.dtype
        )
        slots = torch.arange(batch, device=device)
        positions = torch.full((batch,), 8, dtype=torch.long, device=device)
        # One graph per (batch class, mode, layer kind): a mixed mode has two kinds, and
        # dynamo's default limit of 8 would quietly leave the ninth graph eager.
        with torch._dynamo.config.patch(recompile_limit=_MAX_GRAPHS):
            self._step(slots, x, positions, cache.kv, mode, mark_dynamic=True)
        return time.perf_counter() - started


@dataclass
class CompileResult:
    """What warm-up compiled, what it cost and what it chose."""

    setting: str
    compile_s: float = 0.0
    ms: dict[int, dict[str, float]] = field(default_factory=dict)
    """Decode batch size -> {'eager': ms, 'compiled': ms} per step (--compile auto)."""
    chosen: dict[int, bool] = field(default_factory=dict)
    """Decode batch size -> whether it runs compiled."""
    skipped: dict[int, str] = field(default_factory=dict)
    """Decode batch size -> why it was not compiled."""

    def format(self) -> str:
        rows = [
            f"batch {b}: "
            + (
                f"eager {self.ms[b]['eager']:.2f} ms, compiled {self.ms[b]['compiled']:.2f} ms, "
                if b in self.ms
                else ""
            )
            + ("compiled" if self.chosen.get(b) else f"eager ({self.skipped.get(b, 'slower')})")
            for b in sorted({*self.chosen, *self.skipped})
        ]
        return "\n".join(rows)


def _time_steps(steps_by_name: dict[str, Callable[[], object]], steps: int) -> dict[str, float]:
    """Median ms per call, the contenders called in turn (load elsewhere hits them alike)."""
    for step in steps_by_name.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for _ in range(steps):
        for name, step in steps_by_name.items():
            t0 = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _compile_sizes(
    compiled: CompiledDecode,
    sizes: list[int],
    cache: SlotKVCache,
    budget_s: float,
    result: CompileResult,
) -> list[int]:
    """Compile the graphs ``sizes`` need (one for batch 1, one for larger batches, per mode)
    while the budget lasts (checked before each compile); returns the sizes ready to run."""
    decoder, started = compiled.decoder, time.perf_counter()
    graphs: set[tuple[bool, str]] = set()
    ready: list[int] = []
    for batch in sizes:
        mode = decoder.mode_for(batch)
        if not compilable(decoder, mode):
            result.skipped[batch] = f"{mode}'s kernels do not trace"
            continue
        if (batch > 1, mode) not in graphs:
            if time.perf_counter() - started >= budget_s:
                result.skipped[batch] = f"compile budget {budget_s:g} s spent"
                continue
            compiled.compile_for(cache, batch, mode)
            graphs.add((batch > 1, mode))
        ready.append(batch)
    result.compile_s = time.perf_counter() - started
    return ready


def _eager_vs_compiled(
    compiled: CompiledDecode, cache: SlotKVCache, batch: int, steps: int
) -> dict[str, float]:
    """Median ms per decode step of ``batch`` rows (slots 0..B-1), eager and compiled."""
    decoder, device = compiled.decoder, cache.kv.device
    mode = decoder.mode_for(batch)
    slots = torch.arange(batch, device=device)
    positions = torch.full((batch,), min(64, cache.max_tokens - 1), device=device)
    x = torch.randn(batch, decoder.shape.hidden_size, device=device, dtype=decoder.norm.dtype)
    return _time_steps(
        {
            "eager": lambda: decoder.decode(slots, x, positions, cache, mode=mode),
            "compiled": lambda: compiled.run(slots, x, positions, cache, mode),
        },
        steps,
    )


@torch.inference_mode()
def tune_compiled(
    decoder: LlamaDecoder,
    sizes: list[int],
    cache: SlotKVCache,
    setting: str,
    budget_s: float,
    steps: int = 7,
) -> CompileResult:
    """``--compile``: 'off' leaves every step eager; 'on' compiles the step for every batch
    size whose mode traces; 'auto' also times eager against compiled at each size (in turn,
    on this machine) and keeps the compiled step only where it is faster. Call after
    autotune (the step compiles in the mode each size runs). Compiling stops once
    ``budget_s`` is spent. Writes garbage into slots 0..max(sizes)-1 of ``cache``."""
    result = CompileResult(setting)
    if setting == "off" or not sizes:
        return result
    if cache.kv.device.type != "cpu":
        result.skipped = dict.fromkeys(sizes, "not on CPU")
        return result
    compiled = CompiledDecode(decoder)
    ready = _compile_sizes(compiled, sorted(set(sizes)), cache, budget_s, result)
    for batch in ready:
        if setting == "on":
            result.chosen[batch] = True
            continue
        result.ms[batch] = _eager_vs_compiled(compiled, cache, batch, steps)
        result.chosen[batch] = result.ms[batch]["compiled"] < result.ms[batch]["eager"]
    compiled.sizes = {b: result.chosen.get(b, False) for b in sizes}
    decoder.compiled = compiled if any(compiled.sizes.values()) else None
    log.info(
        "decode step compile (--compile %s, %.1f s compiling, budget %g s, inductor cache %s):\n%s",
        setting,
        result.compile_s,
        budget_s,
        os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's default"),
        result.format(),
    )
    return result
