"""What warm-up measures once per weights and keeps on disk: the GGUF format that the quality
budget chose and the alignment heads. A restart with the same weights reads them back.

One JSON file per key, named by the key's digest; written to a temporary file and renamed, so
replicas that share the folder never read half a file. An unreadable entry is measured over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)


def weights_digest(state_dict: Mapping[str, Tensor]) -> str:
    """blake2b of every tensor's name, dtype, shape and bytes (about 1 s for the full GPT's
    755 MB; the hash is of what is served, so a re-exported file with equal weights matches)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state_dict):
        tensor = state_dict[name].detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        flat = tensor.reshape(-1).contiguous().cpu()
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def snr_db(reference: Tensor, other: Tensor) -> float:
    """Signal-to-noise ratio of ``other`` against ``reference``, in dB (inf when equal)."""
    ref = reference.double()
    noise = (other.double() - ref).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0:
        return float("inf")
    return 10.0 * float(torch.log10(torch.tensor(signal / noise)))


class WarmupCache:
    """A folder of warm-up answers, one JSON file per key (`<prefix>-<digest of the key>.json`,
    holding the key and the answer)."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.folder = folder.expanduser()
        self.prefix = prefix

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
