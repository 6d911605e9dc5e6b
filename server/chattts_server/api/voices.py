"""Every way a request names a voice: a seed, a speaker-embedding string, a named preset or a
zero-shot reference clip (`voice_spec` checks each). Plain Python: no torch.

A voices folder holds one JSON file per preset, named after the preset:

    voices/anna.json   {"description": "calm, female", "seed": 1234}
    voices/bob.json    {"description": "news reader", "speaker_embedding": "<ChatTTS string>"}

The folder is read at start-up and again on `reload()` (SIGHUP).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import lzma
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chattts_proto.chattts.v1 import tts_pb2

from ..engine.protocol import ModelInfo
from ..engine.utterance import VoiceKind, VoiceSpec
from ..errors import InvalidRequestError
from ..text import control_tokens

log = logging.getLogger(__name__)

MAX_EMBEDDING_CHARS = 4096
MAX_REFERENCE_BYTES = 960 * 1024
MAX_REFERENCE_S = 10.0
MAX_TRANSCRIPT_CHARS = 500
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


def voice_spec(
    voice: tts_pb2.Voice, path: str, library: VoiceLibrary, model: ModelInfo
) -> VoiceSpec:
    """The request's voice, checked against the loaded model and `library`'s presets."""
    which = voice.WhichOneof("source")
    if which is None:
        return VoiceSpec()
    if which == "seed":
        return VoiceSpec(VoiceKind.SEED, seed=voice.seed)
    if which == "speaker_embedding":
        try:
            values = decode_speaker_embedding(voice.speaker_embedding)
        except ValueError as exc:
            raise InvalidRequestError(f"{path}.speaker_embedding", str(exc)) from None
        if values.size != model.speaker_dim:
            raise InvalidRequestError(
                f"{path}.speaker_embedding",
                f"has {values.size} values; this model's speakers have {model.speaker_dim}",
            )
        return VoiceSpec(VoiceKind.EMBEDDING, embedding=voice.speaker_embedding)
    if which == "reference":
        return reference_voice(voice.reference, f"{path}.reference", model.sample_rate)
    preset = library.get(voice.preset)
    if preset is None:
        known = ", ".join(p.name for p in library.list()) or "none"
        raise InvalidRequestError(
            f"{path}.preset", f"unknown voice {voice.preset[:64]!r} (known: {known})"
        )
    return preset.spec


def reference_voice(ref: tts_pb2.ReferenceVoice, path: str, rate: int) -> VoiceSpec:
    """Decode and check a zero-shot reference clip: mono float32 at the model's rate."""
    if not ref.audio:
        raise InvalidRequestError(f"{path}.audio", "must hold an audio file (WAV, FLAC or Ogg)")
    if len(ref.audio) > MAX_REFERENCE_BYTES:
        raise InvalidRequestError(
            f"{path}.audio", f"is {len(ref.audio)} bytes; the limit is {MAX_REFERENCE_BYTES}"
        )
    transcript = ref.transcript.strip()
    if not transcript or len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise InvalidRequestError(
            f"{path}.transcript", f"must be 1 to {MAX_TRANSCRIPT_CHARS} characters"
        )
    try:
        control_tokens.check(transcript)
    except ValueError as exc:
        raise InvalidRequestError(f"{path}.transcript", str(exc)) from None
    mono = _reference_audio(ref.audio, f"{path}.audio", rate)
    pcm = np.ascontiguousarray(mono, dtype=np.float32).tobytes()
    return VoiceSpec(
        VoiceKind.REFERENCE,
        reference_pcm=pcm,
        reference_id=hashlib.sha256(pcm).hexdigest()[:16],
        transcript=transcript,
    )


def _reference_audio(data: bytes, path: str, rate: int) -> np.ndarray:
    """The clip decoded, mono at `rate`; InvalidRequestError for what cannot serve."""
    import soundfile as sf
    import soxr

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.frames > MAX_REFERENCE_S * f.samplerate:
                raise InvalidRequestError(path, f"is longer than {MAX_REFERENCE_S:g} s")
            audio = f.read(dtype="float32", always_2d=True)
            source_rate = f.samplerate
    except InvalidRequestError:
        raise
    except Exception:  # soundfile raises several types for undecodable bytes
        raise InvalidRequestError(path, "is not a readable WAV, FLAC or Ogg file") from None
    mono = audio.mean(axis=1)
    if source_rate != rate:
        mono = soxr.resample(mono, source_rate, rate).astype(np.float32)
    if mono.size < rate // 2 or not np.isfinite(mono).all():
        raise InvalidRequestError(path, "must hold at least 0.5 s of finite audio")
    return mono
