"""Autotune's choice, kept on disk per machine, model and torch version.

Timing every linear mode at every batch size takes 13-15 s of a full-model start on a 2-core
CPU, and its answer depends only on what it measured with: the CPU (model name and feature
flags), the intra-op thread count, the weights, torch's version, and what was allowed to
compete. So that answer is stored under a key made of exactly those, and a start whose key
matches applies it without timing; any change in the key (another CPU, a thread count, new
weights, a torch upgrade, another ``--quantize``) finds no entry and measures again.

One JSON file per key, named by the key's digest; written to a temporary file and renamed, so
replicas that share the folder never read half a file. An unreadable entry is measured over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..defaults import MIN_SNR_DB
from .autotune import AutotuneResult, apply_result, autotune
from .cpu_features import cpu_features, read_cpuinfo
from .kv_cache import SlotKVCache

if TYPE_CHECKING:
    from .llama import LlamaDecoder

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped when the entry layout or what autotune measures changes: old entries then miss."""


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The CPU's model name and feature flags (the kernels that win depend on both)."""
    model, flags = read_cpuinfo(cpuinfo)
    if model == "unknown CPU":
        model = platform.processor() or platform.machine()
    return {"cpu_model": model, "cpu_flags": " ".join(sorted(flags))}


def weights_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """blake2b of every tensor's name, dtype, shape and bytes (about 1 s for the full GPT's
    755 MB; the hash is of what is served, so a re-exported file with equal weights matches)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state_dict):
        tensor = state_dict[name].detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        flat = tensor.reshape(-1).contiguous().cpu()
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cache_key(
    weights: str, setting: Mapping[str, Any], cpuinfo: Path = Path("/proc/cpuinfo")
) -> dict[str, Any]:
    """Everything autotune's answer depends on. `setting`: what the run was asked to do
    (quantize, batch sizes, the quality budget, device, dtypes, the candidate modes)."""
    return {
        "format": FORMAT_VERSION,
        **cpu_identity(cpuinfo),
        # A library told to use fewer instructions (model/cpu_features.py) runs other kernels.
        "isa_caps": {lib: cap for lib, cap in sorted(cpu_features().caps.items()) if cap},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "weights": weights,
        **{k: setting[k] for k in sorted(setting)},
    }


class WarmupCache:
    """A folder of warm-up answers, one JSON file per key (`<prefix>-<digest of the key>.json`,
    holding the key and the answer): autotune's table and the alignment heads share it."""

    def __init__(self, folder: Path, prefix: str = "autotune") -> None:
        self.folder = folder.expanduser()
        self.prefix = prefix

    def with_prefix(self, prefix: str) -> WarmupCache:
        """The same folder, another kind of answer."""
        return WarmupCache(self.folder, prefix)

    def path_for(self, key: Mapping[str, Any]) -> Path:
        blob = json.dumps(key, sort_keys=True).encode()
        return self.folder / f"{self.prefix}-{hashlib.sha256(blob).hexdigest()[:20]}.json"

    def load_json(self, key: Mapping[str, Any]) -> Any | None:
        """The answer stored under `key`, or None (absent, unreadable, or another key)."""
        path = self.path_for(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            if entry["key"] != json.loads(json.dumps(key)):
                return None
            return entry["result"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s cache entry %s: %s", self.prefix, path, exc)
            return None

    def store_json(self, key: Mapping[str, Any], result: Any) -> Path | None:
        """Write `result` under `key`; a folder that cannot be written only costs the reuse."""
        path = self.path_for(key)
        entry = {"key": dict(key), "result": result}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{self.prefix}-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not write the %s cache %s: %s", self.prefix, path, exc)
            return None
        return path


class AutotuneCache(WarmupCache):
    """Autotune results in a warm-up cache folder."""

    def load(self, key: Mapping[str, Any]) -> AutotuneResult | None:
        data = self.load_json(key)
        if data is None:
            return None
        try:
            return _result_from(data)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring autotune cache entry %s: %s", self.path_for(key), exc)
            return None

    def store(self, key: Mapping[str, Any], result: AutotuneResult) -> Path | None:
        return self.store_json(key, asdict(result))


@torch.inference_mode()
def tune_or_reuse(
    decoder: LlamaDecoder,
    batch_sizes: list[int],
    cache: SlotKVCache,
    probe: torch.Tensor,
    store: AutotuneCache | None,
    weights: str,
) -> AutotuneResult:
    """`autotune`, unless `store` holds the answer for this machine, model and setting; a
    measured answer is stored. With one candidate mode nothing is timed, so nothing is kept."""
    if store is None or len(decoder.modes) < 2:
        return autotune(decoder, batch_sizes, cache, probe=probe)
    setting = {
        "quantize": decoder.quantize,
        "modes": decoder.modes,
        "batch_sizes": sorted(set(batch_sizes)),
        "min_snr_db": MIN_SNR_DB,
        "device": str(cache.kv.device),
        "model_dtype": str(decoder.norm.dtype),
        "kv_dtype": str(decoder.kv_dtype),
        "probe": weights_digest({"probe": probe}),
    }
    key = cache_key(weights, setting)
    hit = store.load(key)
    if hit is not None and {*hit.table.values(), hit.prefill_mode} <= set(decoder.modes):
        apply_result(decoder, hit, f"reused {store.path_for(key)}")
        return hit
    result = autotune(decoder, batch_sizes, cache, probe=probe)
    path = store.store(key, result)
    if path is not None:
        log.info("autotune result stored in %s; a restart with the same key reuses it", path)
    return result


def _result_from(data: Mapping[str, Any]) -> AutotuneResult:
    """JSON turns int keys into strings; put them back."""

    def by_batch(d: Mapping[str, Any]) -> dict[int, Any]:
        return {int(b): v for b, v in d.items()}

    return AutotuneResult(
        table={b: str(m) for b, m in by_batch(data["table"]).items()},
        ms=by_batch(data.get("ms", {})),
        snr_db=dict(data.get("snr_db", {})),
        excluded=dict(data.get("excluded", {})),
        prefill_mode=str(data["prefill_mode"]),
        prefill_ms=dict(data.get("prefill_ms", {})),
        prefill_tokens=int(data.get("prefill_tokens", 0)),
    )
