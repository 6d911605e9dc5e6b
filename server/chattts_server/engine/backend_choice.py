"""Which backend runs the GPT's layers, decided at warm-up on the machine itself (`--backend`).

`torch` is our forward (`TorchGPT`, every device, CUDA graphs); `llamacpp` is llama.cpp over
GGUF weights (`LlamaCppGPT`, CPU). Under `auto` on CPU each llama.cpp format competes with torch
(already autotuned): a format serves only if its hidden states on the probe are within the SNR
budget of torch fp32 on the loaded weights, then the fastest decode step wins (geometric mean over
the warm-up batch sizes). One backend serves every batch size: a slot's K/V lives in one backend.
Where llama.cpp cannot be imported (the build failed, another platform), torch serves and the
log says why.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..defaults import MIN_SNR_DB
from ..model.autotune import snr_db
from .gpt import TorchGPT
from .llamacpp_gpt import LlamaCppGPT, import_llama_cpp

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger(__name__)

AUTO_FORMATS = ("F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K")
"""What competes under `--gguf-format auto` (F32 only when named: exact, and the slowest)."""
_CONTEXT_TOKENS = 64
"""Cached positions per sequence when a decode step is timed (as torch's autotune)."""


def llamacpp_unavailable() -> str | None:
    """Why the llama.cpp backend cannot run here, or None."""
    try:
        import_llama_cpp()
    except Exception as exc:  # noqa: BLE001 - ImportError, OSError from the shared library...
        return f"llama-cpp-python does not load ({type(exc).__name__}: {exc})"
    return None


@dataclass
class BackendChoice:
    backend: str
    """'torch' or 'llamacpp'."""
    weight_format: str = ""
    """The GGUF format with llama.cpp."""
    snr_db: dict[str, float] = field(default_factory=dict)
    """Each llama.cpp format's hidden-state SNR against torch fp32 on the probe."""
    step_ms: dict[str, float] = field(default_factory=dict)
    """Geometric mean decode step over the warm-up sizes: 'torch' and each format measured."""
    reason: str = ""


def choose_backend(
    runner: ModelRunner, sizes: list[int], probe: torch.Tensor, reference: torch.Tensor | None
) -> BackendChoice:
    """The backend `runner` serves with: 'torch', or llama.cpp in the format that won.
    `reference`: the probe's hidden states in fp32 (`warmup.fp32_reference`)."""
    settings = runner.backend
    if settings.backend == "torch" or runner.device.type != "cpu":
        why = "asked for" if settings.backend == "torch" else f"{runner.device.type} device"
        return BackendChoice("torch", reason=why)
    missing = llamacpp_unavailable()
    if missing is not None:
        log.warning("--backend %s: serving torch; %s", settings.backend, missing)
        return BackendChoice("torch", reason=missing)
    torch_gpt = runner.gpt
    assert isinstance(torch_gpt, TorchGPT)
    named = settings.gguf_format != "auto"
    formats = [settings.gguf_format] if named else list(AUTO_FORMATS)
    choice = BackendChoice("torch")
    if settings.backend == "auto":
        choice.step_ms["torch"] = _mean_step_ms(lambda b: _time_torch(torch_gpt, b), sizes)
    assert reference is not None, "an fp32 reference is taken wherever llama.cpp competes"
    best: tuple[float, str] | None = None
    for weight_format in formats:
        gpt = runner.build_llamacpp(weight_format)
        try:
            hidden = gpt.hidden_states(0, probe)
            choice.snr_db[weight_format] = snr_db(reference, hidden)
            if choice.snr_db[weight_format] < MIN_SNR_DB and not named:
                continue
            ms = _mean_step_ms(lambda b, g=gpt: _time_llamacpp(g, b), sizes)  # type: ignore[misc]
            choice.step_ms[weight_format] = ms
            if best is None or ms < best[0]:
                best = (ms, weight_format)
        finally:
            gpt.close()
    if best is not None and (settings.backend == "llamacpp" or best[0] < choice.step_ms["torch"]):
        choice.backend, choice.weight_format = "llamacpp", best[1]
    elif settings.backend == "llamacpp":
        choice.reason = f"no format within {MIN_SNR_DB:g} dB of fp32"
    _log(choice)
    return choice


def _log(choice: BackendChoice) -> None:
    rows = ", ".join(
        f"{name} {choice.step_ms.get(name, float('nan')):.1f} ms"
        + (f" ({choice.snr_db[name]:.1f} dB)" if name in choice.snr_db else "")
        for name in dict.fromkeys([*choice.step_ms, *choice.snr_db])
    )
    served = choice.backend + (f" {choice.weight_format}" if choice.weight_format else "")
    log.info("GPT backend: %s (geometric mean decode step over warm-up sizes: %s)", served, rows)


def _mean_step_ms(time_step, sizes: list[int]) -> float:  # type: ignore[no-untyped-def]
    """The geometric mean over batch sizes: each size counts alike in relative terms (an
    arithmetic mean would be the largest batch's choice, where one stream's RTF is not)."""
    return statistics.geometric_mean(time_step(b) for b in sizes)


def _time_torch(gpt: TorchGPT, batch: int, steps: int = 3) -> float:
    d = gpt.shape.hidden_size
    slots = torch.arange(batch)
    positions = torch.full((batch,), _CONTEXT_TOKENS, dtype=torch.long)
    x = torch.zeros(batch, d)
    gpt.llama.decode(slots, x, positions, gpt.cache)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        gpt.llama.decode(slots, x, positions, gpt.cache)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def _time_llamacpp(gpt: LlamaCppGPT, batch: int, steps: int = 3) -> float:
    from ..model.llama import DecodeBatch, PromptRun

    d = gpt.shape.hidden_size
    context = torch.zeros(_CONTEXT_TOKENS, d)
    for slot in range(batch):
        gpt.free_slot(slot)
    gpt.forward([PromptRun(slot, context, 0) for slot in range(batch)], None)
    times = []
    for step in range(steps + 1):
        decode = DecodeBatch(
            torch.arange(batch), torch.zeros(batch, d), torch.full((batch,), _CONTEXT_TOKENS + step)
        )
        started = time.perf_counter()
        gpt.forward([], decode)
        if step:  # the first step pays for lazy initialisation
            times.append((time.perf_counter() - started) * 1e3)
    for slot in range(batch):
        gpt.free_slot(slot)
    return statistics.median(times)
