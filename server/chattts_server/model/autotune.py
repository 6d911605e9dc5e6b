"""Pick the fastest linear mode per decode batch size, on the machine the server runs on.

The oneDNN-packed fp32 matmul ran 2x faster than MKL's on one 2-core CPU and no faster on
another; int8 and bf16 differ as much. So at warm-up each allowed mode is timed at each batch
size the scheduler will use, and the decoder runs the fastest from then on. Under
``--quantize auto`` a lossy mode competes only where its hidden states stay within the quality
budget (SNR against the lossless mode on the same inputs), measured here on the loaded weights.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..defaults import MIN_SNR_DB
from .kv_cache import SlotKVCache
from .linear_modes import MODES

if TYPE_CHECKING:
    from .llama import LlamaDecoder

log = logging.getLogger(__name__)

_PROBE_TOKENS = 32


def snr_db(reference: Tensor, other: Tensor) -> float:
    """Signal-to-noise ratio of ``other`` against ``reference``, in dB (inf when equal)."""
    ref = reference.double()
    noise = (other.double() - ref).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0:
        return float("inf")
    return 10.0 * float(torch.log10(torch.tensor(signal / noise)))


@dataclass
class AutotuneResult:
    """What autotune measured and chose."""

    table: dict[int, str]
    """Decode batch size -> the mode the decoder now uses for it."""
    ms: dict[int, dict[str, float]] = field(default_factory=dict)
    """Decode batch size -> mode -> median ms per decode step."""
    snr_db: dict[str, float] = field(default_factory=dict)
    """Mode -> hidden-state SNR against the lossless reference (where measured)."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Mode -> why it did not compete (over the quality budget)."""
    prefill_mode: str = ""
    """The mode prefill now uses (compute-bound, so often not batch 1's)."""
    prefill_ms: dict[str, float] = field(default_factory=dict)
    """Mode -> median ms to prefill the probe prompt."""
    prefill_tokens: int = 0

    def format(self) -> str:
        modes = sorted({m for row in self.ms.values() for m in row}, key=list(MODES).index)
        head = "batch " + " ".join(f"{m:>12}" for m in modes) + "  chosen"
        rows = [
            f"{b:>5} "
            + " ".join(f"{self.ms[b].get(m, float('nan')):>9.2f} ms" for m in modes)
            + f"  {self.table[b]}"
            for b in sorted(self.ms)
        ]
        if self.prefill_ms:
            rows.append(
                f"prefill of {self.prefill_tokens} tokens: "
                + ", ".join(f"{m} {ms:.1f} ms" for m, ms in self.prefill_ms.items())
                + f"  chosen {self.prefill_mode}"
            )
        notes = [f"{m}: SNR {v:.1f} dB" for m, v in self.snr_db.items()]
        notes += [f"{m} excluded: {why}" for m, why in self.excluded.items()]
        return "\n".join([head, *rows, *notes])


def measure_snr(
    decoder: LlamaDecoder, probe: Tensor, reference: str, modes: list[str]
) -> dict[str, float]:
    """Hidden-state SNR of each mode (K/V in the decoder's ``kv_dtype``) against ``reference``
    with K/V in the model dtype, for one prefill of ``probe`` (L, D)."""

    device, dtype = probe.device, probe.dtype
    exact = SlotKVCache(decoder.shape, 1, probe.shape[0], device, dtype)
    served = SlotKVCache(decoder.shape, 1, probe.shape[0], device, decoder.kv_dtype)
    expected = decoder.prefill(0, probe, 0, exact, mode=reference)
    return {m: snr_db(expected, decoder.prefill(0, probe, 0, served, mode=m)) for m in modes}


def time_prefill(
    decoder: LlamaDecoder, cache: SlotKVCache, probe: Tensor, modes: list[str], steps: int
) -> dict[str, float]:
    """Median ms to prefill ``probe`` (L, D) into slot 0 for each mode, the modes in turn."""
    times: dict[str, list[float]] = {m: [] for m in modes}
    for repeat in range(steps + 1):
        for mode in modes:
            t0 = time.perf_counter()
            decoder.prefill(0, probe, 0, cache, mode=mode)
            if probe.device.type == "cuda":
                torch.cuda.synchronize(probe.device)
            if repeat:  # the first round pays for lazy initialisation
                times[mode].append((time.perf_counter() - t0) * 1e3)
    return {m: statistics.median(ts) for m, ts in times.items()}


def time_modes(
    decoder: LlamaDecoder, cache: SlotKVCache, batch: int, modes: list[str], steps: int
) -> dict[str, float]:
    """Median ms per decode step of ``batch`` rows for each mode, the modes called in turn so
    that load from elsewhere on the machine hits them alike."""
    device, dtype = cache.kv.device, decoder.norm.dtype  # the model's, not the cache's
    slots = torch.arange(batch, device=device)
    context = min(64, cache.max_tokens - 1)
    positions = torch.full((batch,), context, dtype=torch.long, device=device)
    x = torch.randn(batch, decoder.shape.hidden_size, device=device, dtype=dtype)

    def step(mode: str) -> float:
        t0 = time.perf_counter()
        decoder.decode(slots, x, positions, cache, mode=mode)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    for mode in modes:  # first calls pay for lazy initialisation
        step(mode)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(steps):
        for mode in modes:
            times[mode].append(step(mode))
    return {m: statistics.median(ts) for m, ts in times.items()}


@torch.inference_mode()
def autotune(
    decoder: LlamaDecoder,
    batch_sizes: list[int],
    cache: SlotKVCache,
    probe: Tensor | None = None,
    min_snr_db: float = MIN_SNR_DB,
    steps: int = 5,
) -> AutotuneResult:
    """Time each allowed mode at each decode batch size and have the decoder use the fastest.

    Under ``quantize='auto'`` a lossy mode competes only if the hidden states it gives for
    ``probe`` (L, D) embeddings (default: random) are within ``min_snr_db`` of the lossless
    mode's. Logs the table and frees the weights of modes no size chose. Writes garbage into
    slots 0..max(batch_sizes)-1 of ``cache``: call it at warm-up, before any request.
    """
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[-1] > cache.num_slots:
        raise ValueError(f"batch sizes {sizes} need 1..{cache.num_slots} slots")
    candidates = decoder.modes
    result = AutotuneResult(table={})
    lossless = [m for m in candidates if MODES[m].lossless]
    model_dtype = decoder.norm.dtype
    if probe is None:
        generator = torch.Generator().manual_seed(0)
        probe = torch.randn(_PROBE_TOKENS, decoder.shape.hidden_size, generator=generator)
    probe = probe[: cache.max_tokens].to(device=cache.kv.device, dtype=model_dtype)
    # With K/V in a narrower dtype than the model's, every mode is lossy.
    checked = [m for m in candidates if not MODES[m].lossless or decoder.kv_dtype != model_dtype]
    if decoder.quantize == "auto" and lossless and checked:
        result.snr_db = measure_snr(decoder, probe, lossless[0], checked)
        for mode, snr in result.snr_db.items():
            if snr < min_snr_db:
                result.excluded[mode] = f"hidden-state SNR {snr:.1f} dB < {min_snr_db:g} dB"
        kept = [m for m in candidates if m not in result.excluded]
        if not kept:
            log.warning("no linear mode within %g dB; using %s", min_snr_db, lossless[0])
            kept = [lossless[0]]
        candidates = kept
    started = time.perf_counter()
    for batch in sizes:
        ms = time_modes(decoder, cache, batch, candidates, steps) if len(candidates) > 1 else {}
        result.ms[batch] = ms
        result.table[batch] = min(ms, key=ms.__getitem__) if ms else candidates[0]
    if len(candidates) > 1:
        result.prefill_ms = time_prefill(decoder, cache, probe, candidates, max(1, steps // 2))
        result.prefill_tokens = probe.shape[0]
    result.prefill_mode = (
        min(result.prefill_ms, key=result.prefill_ms.__getitem__)
        if result.prefill_ms
        else result.table[sizes[-1]]
    )
    apply_result(decoder, result, f"{time.perf_counter() - started:.1f} s")
    return result


def apply_result(decoder: LlamaDecoder, result: AutotuneResult, how: str) -> None:
    """Have the decoder use `result`'s modes, free the others' weights and log the table;
    `how` says where the result came from (the seconds measured, or the cache entry)."""
    before = decoder.weight_bytes()
    decoder.set_mode_table(result.table)
    decoder.prefill_mode = result.prefill_mode
    decoder.keep_modes({*result.table.values(), result.prefill_mode})
    log.info(
        "linear-mode autotune (--quantize %s, %s; weights %.0f -> %.0f MiB):\n%s",
        decoder.quantize,
        how,
        before / 2**20,
        decoder.weight_bytes() / 2**20,
        result.format(),
    )
