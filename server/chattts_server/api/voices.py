"""Named voice presets and speaker-embedding strings. Plain Python: no torch.

A voices folder holds one JSON file per preset, named after the preset:

    voices/anna.json   {"description": "calm, female", "seed": 1234}
    voices/bob.json    {"description": "news reader", "speaker_embedding": "<ChatTTS string>"}

The folder is read at start-up and again on `reload()` (SIGHUP).
"""

from __future__ import annotations

import json
import logging
import lzma
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.utterance import VoiceKind, VoiceSpec

log = logging.getLogger(__name__)

MAX_EMBEDDING_CHARS = 4096
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


@dataclass(frozen=True)
class VoicePreset:
    name: str
    description: str
    spec: VoiceSpec


def decode_speaker_embedding(text: str) -> np.ndarray:
    """Decode a ChatTTS speaker-embedding string to float16 values; ValueError if malformed."""
    import pybase16384 as b14

    if not text or len(text) > MAX_EMBEDDING_CHARS:
        raise ValueError(f"must be 1 to {MAX_EMBEDDING_CHARS} characters")
    try:
        raw = lzma.decompress(
            b14.decode_from_string(text), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS
        )
    except Exception as exc:  # pybase16384 and lzma raise several types
        raise ValueError("is not a ChatTTS speaker embedding (base16384 + lzma)") from exc
    if len(raw) % 2:
        raise ValueError("is not a ChatTTS speaker embedding (odd byte count)")
    values = np.frombuffer(raw, dtype=np.float16)
    if not np.all(np.isfinite(values)):
        raise ValueError("holds NaN or infinite values")
    return values


def _load_preset(path: Path) -> VoicePreset:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("must hold a JSON object")
    description = str(data.get("description", ""))
    if "seed" in data and "speaker_embedding" in data:
        raise ValueError("give either seed or speaker_embedding, not both")
    if "seed" in data:
        seed = data["seed"]
        if not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError("seed must be an integer in [0, 2^32)")
        return VoicePreset(path.stem, description, VoiceSpec(VoiceKind.SEED, seed=seed))
    if "speaker_embedding" in data:
        emb = str(data["speaker_embedding"])
        decode_speaker_embedding(emb)
        return VoicePreset(path.stem, description, VoiceSpec(VoiceKind.EMBEDDING, embedding=emb))
    raise ValueError("needs seed or speaker_embedding")


class VoiceLibrary:
    """The presets of a voices folder; thread-safe reads, atomic reloads."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._presets: dict[str, VoicePreset] = {}
        self.reload()

    def reload(self) -> int:
        """Re-read the folder; bad files are logged and skipped. Returns the preset count."""
        presets: dict[str, VoicePreset] = {}
        if self.folder is not None:
            for path in sorted(self.folder.glob("*.json")):
                if not _NAME.match(path.stem):
                    log.warning("voice preset %s: name must match %s; skipped", path, _NAME.pattern)
                    continue
                try:
                    presets[path.stem] = _load_preset(path)
                except (OSError, ValueError) as exc:
                    log.warning("voice preset %s: %s; skipped", path, exc)
        with self._lock:
            self._presets = presets
        log.info("loaded %d voice presets from %s", len(presets), self.folder)
        return len(presets)

    def get(self, name: str) -> VoicePreset | None:
        with self._lock:
            return self._presets.get(name)

    def list(self) -> list[VoicePreset]:
        with self._lock:
            return sorted(self._presets.values(), key=lambda p: p.name)
