"""The GPT the server serves, finished before the runner is made (`build_gpt`): one way per device.

- CUDA: our torch forward (`TorchGPT`) in fp16, its decode step captured as CUDA graphs.
- CPU: llama.cpp (`LlamaCppGPT`), in the smallest GGUF format whose hidden states on the loaded
  weights are within the quality budget (`MIN_SNR_DB`) of fp32. The rule holds on any CPU: no
  timing contest, whose winner changes with the machine's load. The answer is measured once per
  weights digest and kept beside the GGUF files; `--gguf-format` names a format instead.
- CPU where llama.cpp does not load (its build failed): torch, plain fp32, and the log says why.

The alignment heads are calibrated on what serves (cached per weights), and once llama.cpp
serves, the GPT's torch weights are dropped (`modules.gpt_state_dict` is emptied).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..config import EngineConfig
from ..config_model import ModelConfig
from ..defaults import GGUF_FORMATS, MIN_SNR_DB
from ..model.gguf_export import GGUFCache
from ..model.kv_cache import SlotKVCache
from ..model.llama import LlamaDecoder
from ..model.llama_layers import LlamaShape
from ..model.loader import ChatTTSModules
from ..model.warmup_cache import WarmupCache, snr_db, weights_digest
from ..timing.alignment import HeadCache
from .gpt import GPTModel, TorchGPT
from .heads import Heads
from .llamacpp_gpt import LlamaCppGPT, llamacpp_unavailable
from .prompts import PromptBuilder
from .utterance import VoiceSpec

log = logging.getLogger(__name__)

SMALLEST_FIRST = tuple(reversed(GGUF_FORMATS))
"""The order `--gguf-format auto` tries formats in; F32 (exact) always passes."""
QUALITY_PROBE = "Warm up [uv_break] in 2 minutes, please!"
"""The prompt whose hidden states hold a format against fp32."""


@dataclass(frozen=True)
class GPTSettings:
    """What the command line says about the GPT (`ModelConfig`)."""

    gguf_format: str = "auto"
    gguf_folder: Path = Path("gguf")
    cuda_graphs: bool = True

    @classmethod
    def from_config(cls, model: ModelConfig, engine: EngineConfig) -> GPTSettings:
        return cls(model.gguf_format, model.gguf_folder(), engine.cuda_graphs)


@torch.inference_mode()
def build_gpt(
    modules: ChatTTSModules,
    config: EngineConfig,
    settings: GPTSettings,
    device: torch.device,
    dtype: torch.dtype,
    prompts: PromptBuilder,
    heads: Heads,
) -> GPTModel:
    """The GPT that serves on `device`, finished: weights in their format, graphs captured,
    alignment heads calibrated (or read back). `prompts` and `heads` make the probes."""
    started = time.monotonic()
    digest = weights_digest(modules.gpt_state_dict)
    alignment = HeadCache(settings.gguf_folder, digest, modules)
    gpt: GPTModel
    if device.type == "cuda":
        graphs = "cuda" if settings.cuda_graphs else "off"
        gpt = capture_graphs(TorchGPT.build(modules, config, device, dtype, graphs))
    elif (missing := llamacpp_unavailable()) is None:
        gpt = _llamacpp_gpt(modules, config, settings, digest, prompts, alignment)
    else:
        log.warning("the GPT runs on torch fp32: %s", missing)
        gpt = TorchGPT.build(modules, config, device, torch.float32, decode_graphs="off")
    served = gpt.name if isinstance(gpt, LlamaCppGPT) else f"{gpt.name} {dtype}"
    gpt.alignment_heads = alignment.settle(
        gpt,
        served,
        lambda text, speed: prompts.code_prompt(prompts.normalize(text), VoiceSpec(), speed),
        heads.greedy_code_embed,
        config.max_tokens,
        dtype,
    )
    if isinstance(gpt, LlamaCppGPT):
        gpt.set_attention_tap(bool(gpt.alignment_heads))  # no heads: no callback per node
    modules.gpt_state_dict.clear()  # torch holds its own copy; llama.cpp its GGUF
    log.info("GPT: %s, built in %.1f s", gpt.name, time.monotonic() - started)
    return gpt


def capture_graphs(gpt: TorchGPT) -> TorchGPT:
    """Capture the decode step's CUDA graphs; where that fails (driver, memory, an op that
    cannot be captured) serve with the eager decode, saying why (`TorchGPT.drop_graphs`)."""
    if gpt.graphs is not None:
        try:
            gpt.graphs.capture_all()
        except Exception as exc:  # noqa: BLE001 - graphs only speed decoding up
            gpt.drop_graphs(exc)
    return gpt


def _llamacpp_gpt(
    modules: ChatTTSModules,
    config: EngineConfig,
    settings: GPTSettings,
    digest: str,
    prompts: PromptBuilder,
    alignment: HeadCache,
) -> LlamaCppGPT:
    files = GGUFCache(settings.gguf_folder, digest)
    shape = LlamaShape.from_config(modules.gpt_config)
    rope_theta = float(getattr(modules.gpt_config, "rope_theta", 10000.0))
    threads = torch.get_num_threads()

    def build(weight_format: str, tap: bool, files: GGUFCache = files) -> LlamaCppGPT:
        path = files.get(weight_format, modules.gpt_state_dict or None, shape, rope_theta, threads)
        max_batch = config.prefill_chunk_tokens + config.max_streams
        slots, max_tokens = config.max_streams, config.max_tokens
        return LlamaCppGPT(path, shape, slots, max_tokens, max_batch, threads, weight_format, tap)

    weight_format = settings.gguf_format
    if weight_format == "auto":
        weight_format = choose_gguf_format(modules, files, prompts, build)
    known = alignment.known(f"llamacpp {weight_format}")
    return build(weight_format, tap=known is None or bool(known))  # a tap to calibrate or read


_BuildGPT = Callable[[str, bool, GGUFCache], LlamaCppGPT]
"""(format, with an attention tap, the folder of files) -> the GPT on llama.cpp."""


def choose_gguf_format(
    modules: ChatTTSModules, files: GGUFCache, prompts: PromptBuilder, build: _BuildGPT
) -> str:
    """The smallest format whose hidden states on the quality probe are within `MIN_SNR_DB` of
    fp32's (our torch forward on the loaded weights), kept per weights digest beside `files`."""
    probe = prompts.code_prompt(prompts.normalize(QUALITY_PROBE), VoiceSpec(), 5).embeds.float()
    store = WarmupCache(files.folder, "gguf-format")
    key = {
        "version": 2,  # 2: K cached in Q8_0
        "gpt": files.digest,
        "min_snr_db": MIN_SNR_DB,
        "candidates": list(SMALLEST_FIRST),
        "probe": weights_digest({"probe": probe}),
    }
    cached = store.load_json(key)
    if isinstance(cached, dict) and cached.get("format") in GGUF_FORMATS:
        log.info(
            "GGUF format %s (the smallest within %g dB of fp32; measured before: %s)",
            cached["format"],
            MIN_SNR_DB,
            store.path_for(key),
        )
        return str(cached["format"])
    snr: dict[str, float] = {}
    chosen = _measure_formats(modules, files, probe, build, snr)
    store.store_json(key, {"format": chosen, "snr_db": snr})
    log.info(
        "GGUF format %s: the smallest within %g dB of fp32 (hidden-state SNR %s)",
        chosen,
        MIN_SNR_DB,
        ", ".join(f"{f} {db:.1f} dB" for f, db in snr.items()),
    )
    return chosen


def _measure_formats(
    modules: ChatTTSModules,
    files: GGUFCache,
    probe: Tensor,
    build: _BuildGPT,
    snr: dict[str, float],
) -> str:
    """`smallest_within_budget`, measured (into `snr`). The candidates are written in a folder
    of this process's own, and only the chosen file moves into `files`: replicas sharing the
    folder never see a file that is not served."""
    reference = fp32_reference(modules, probe)
    files.folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=files.folder, prefix=".candidates-") as scratch:
        candidates = GGUFCache(Path(scratch), files.digest)

        def measure(weight_format: str) -> float:
            gpt = build(weight_format, False, candidates)
            try:
                return snr_db(reference, gpt.hidden_states(0, probe))
            finally:
                gpt.close()

        chosen = smallest_within_budget(measure, snr)
        os.replace(candidates.path(chosen), files.path(chosen))
    return chosen


def smallest_within_budget(measure: Callable[[str], float], snr: dict[str, float]) -> str:
    """The first format of SMALLEST_FIRST whose hidden-state SNR reaches MIN_SNR_DB (F32
    always does): `snr` holds what is measured already; `measure(format)` fills the rest, in
    order, only as far as the answer needs."""
    for weight_format in SMALLEST_FIRST:
        if weight_format not in snr:
            snr[weight_format] = measure(weight_format)
        if snr[weight_format] >= MIN_SNR_DB:
            return weight_format
    return SMALLEST_FIRST[-1]


def fp32_reference(modules: ChatTTSModules, probe: Tensor) -> Tensor:
    """`probe`'s hidden states (L, D) through our torch forward in fp32 on the loaded weights."""
    decoder = LlamaDecoder.from_state_dict(
        modules.gpt_config, modules.gpt_state_dict, "cpu", torch.float32
    )
    cache = SlotKVCache(decoder.shape, 1, probe.shape[0], "cpu", torch.float32)
    return decoder.prefill(0, probe, 0, cache)
