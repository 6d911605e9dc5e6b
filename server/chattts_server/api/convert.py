"""Protobuf <-> domain conversion and request validation.

Everything a client sends passes through here before it reaches the engine. A bad value raises
`FieldError` naming the field as the client spelled it (`config.sampling.top_p`), which the
servicer turns into INVALID_ARGUMENT with google.rpc.BadRequest details.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from chattts_client._proto.chattts.v1 import tts_pb2

from ..audio.encoding import SUPPORTED_SAMPLE_RATES
from ..engine.types import (
    ChunkingOptions,
    RefineOptions,
    SamplingOptions,
    UtteranceDone,
    VoiceKind,
    VoiceSpec,
)
from ..voices import VoiceLibrary, decode_speaker_embedding

ENCODING_NAMES = {
    tts_pb2.AUDIO_ENCODING_UNSPECIFIED: "LINEAR16",
    tts_pb2.LINEAR16: "LINEAR16",
    tts_pb2.MULAW: "MULAW",
    tts_pb2.ALAW: "ALAW",
    tts_pb2.OGG_OPUS: "OGG_OPUS",
    tts_pb2.FLOAT32: "FLOAT32",
}
ENCODING_VALUES = {name: value for value, name in ENCODING_NAMES.items() if value}


class FieldError(ValueError):
    """A request field is invalid; `field_name` is its path in the request."""

    def __init__(self, field_name: str, description: str) -> None:
        super().__init__(f"{field_name}: {description}")
        self.field_name = field_name
        self.description = description


@dataclass(frozen=True)
class AudioOptions:
    encoding: str = "LINEAR16"
    """One of ENCODING_VALUES' keys."""
    sample_rate_hz: int = 24000


@dataclass(frozen=True)
class StreamSettings:
    """A validated SynthesisConfig: what every utterance of a stream is synthesized with."""

    voice: VoiceSpec = field(default_factory=VoiceSpec)
    speed: int = 5
    refine: RefineOptions = field(default_factory=RefineOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    audio: AudioOptions = field(default_factory=AudioOptions)
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)


@dataclass(frozen=True)
class Validator:
    """Validates requests against the server's limits and the loaded model."""

    voices: VoiceLibrary
    speaker_dim: int
    native_sample_rate: int = 24000
    max_new_tokens: int = 768
    max_text_chars: int = 4000
    supported_encodings: tuple[str, ...] = ("LINEAR16",)

    def text(self, text: str, field_name: str, allow_empty: bool = False) -> str:
        if len(text) > self.max_text_chars:
            raise FieldError(
                field_name, f"is {len(text)} characters; the limit is {self.max_text_chars}"
            )
        if not allow_empty and not text.strip():
            raise FieldError(field_name, "must not be empty or whitespace only")
        if "\x00" in text:
            raise FieldError(field_name, "must not contain NUL characters")
        return text

    def settings(self, config: tts_pb2.SynthesisConfig, prefix: str = "config") -> StreamSettings:
        return StreamSettings(
            voice=self._voice(config.voice, f"{prefix}.voice")
            if config.HasField("voice")
            else VoiceSpec(),
            speed=self._speed(config.prosody, f"{prefix}.prosody"),
            refine=self._refine(config.prosody, f"{prefix}.prosody"),
            sampling=self._sampling(config.sampling, f"{prefix}.sampling"),
            audio=self._audio(config.audio_format, f"{prefix}.audio_format"),
        )

    def _voice(self, voice: tts_pb2.Voice, path: str) -> VoiceSpec:
        which = voice.WhichOneof("source")
        if which is None:
            return VoiceSpec()
        if which == "seed":
            return VoiceSpec(VoiceKind.SEED, seed=voice.seed)
        if which == "speaker_embedding":
            try:
                values = decode_speaker_embedding(voice.speaker_embedding)
            except ValueError as exc:
                raise FieldError(f"{path}.speaker_embedding", str(exc)) from None
            if values.size != self.speaker_dim:
                raise FieldError(
                    f"{path}.speaker_embedding",
                    f"has {values.size} values; this model's speakers have {self.speaker_dim}",
                )
            return VoiceSpec(VoiceKind.EMBEDDING, embedding=voice.speaker_embedding)
        if which == "reference":
            return reference_voice(voice.reference, f"{path}.reference", self.native_sample_rate)
        preset = self.voices.get(voice.preset)
        if preset is None:
            known = ", ".join(p.name for p in self.voices.list()) or "none"
            raise FieldError(
                f"{path}.preset", f"unknown voice {voice.preset[:64]!r} (known: {known})"
            )
        return preset.spec

    @staticmethod
    def _finite(value: float, path: str, low: float, high: float, low_open: bool = False) -> float:
        if not math.isfinite(value):
            raise FieldError(path, "must be a finite number")
        if value > high or value < low or (low_open and value == low):
            bracket = "(" if low_open else "["
            raise FieldError(path, f"must be in {bracket}{low:g}, {high:g}], got {value:g}")
        return value

    def _speed(self, prosody: tts_pb2.Prosody, path: str) -> int:
        if not prosody.HasField("speed"):
            return 5
        return round(self._finite(prosody.speed, f"{path}.speed", 0, 9))

    def _refine(self, prosody: tts_pb2.Prosody, path: str) -> RefineOptions:
        def level(name: str, default: int, high: int) -> int:
            if not prosody.HasField(name):
                return default
            value = getattr(prosody, name)
            if value > high:
                raise FieldError(f"{path}.{name}", f"must be in [0, {high}], got {value}")
            return int(value)

        return RefineOptions(
            enabled=prosody.refine_text,
            oral=level("oral", 2, 9),
            laugh=level("laugh", 0, 2),
            break_level=level("break_level", 6, 7),
        )

    def _sampling(self, s: tts_pb2.Sampling, path: str) -> SamplingOptions:
        d = SamplingOptions(max_new_tokens=self.max_new_tokens)
        temperature = (
            self._finite(s.temperature, f"{path}.temperature", 0, 5, low_open=True)
            if s.HasField("temperature")
            else d.temperature
        )
        top_p = (
            self._finite(s.top_p, f"{path}.top_p", 0, 1, low_open=True)
            if s.HasField("top_p")
            else d.top_p
        )
        rep = (
            self._finite(s.repetition_penalty, f"{path}.repetition_penalty", 1, 2)
            if s.HasField("repetition_penalty")
            else d.repetition_penalty
        )
        top_k = d.top_k
        if s.HasField("top_k"):
            if not 1 <= s.top_k <= 626:
                raise FieldError(f"{path}.top_k", f"must be in [1, 626], got {s.top_k}")
            top_k = s.top_k
        max_new = d.max_new_tokens
        if s.HasField("max_new_tokens"):
            if not 1 <= s.max_new_tokens <= self.max_new_tokens:
                raise FieldError(
                    f"{path}.max_new_tokens",
                    f"must be in [1, {self.max_new_tokens}], got {s.max_new_tokens}",
                )
            max_new = s.max_new_tokens
        min_new = 0
        if s.HasField("min_new_tokens"):
            if s.min_new_tokens > max_new:
                raise FieldError(f"{path}.min_new_tokens", f"must be <= max_new_tokens ({max_new})")
            min_new = s.min_new_tokens
        return SamplingOptions(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=rep,
            seed=s.seed if s.HasField("seed") else None,
            max_new_tokens=max_new,
            min_new_tokens=min_new,
        )

    def _audio(self, fmt: tts_pb2.AudioFormat, path: str) -> AudioOptions:
        if fmt.encoding not in ENCODING_NAMES:
            raise FieldError(f"{path}.encoding", f"unknown encoding value {fmt.encoding}")
        encoding = ENCODING_NAMES[fmt.encoding]
        if encoding not in self.supported_encodings:
            raise FieldError(
                f"{path}.encoding",
                f"{encoding} is not supported by this server (supported: {', '.join(self.supported_encodings)})",
            )
        rate = fmt.sample_rate_hz or self.native_sample_rate
        if rate not in SUPPORTED_SAMPLE_RATES:
            rates = ", ".join(str(r) for r in SUPPORTED_SAMPLE_RATES)
            raise FieldError(f"{path}.sample_rate_hz", f"must be 0 or one of {rates}, got {rate}")
        return AudioOptions(encoding=encoding, sample_rate_hz=rate)


MAX_REFERENCE_BYTES = 960 * 1024
MAX_REFERENCE_S = 10.0
MAX_TRANSCRIPT_CHARS = 500


def reference_voice(ref: tts_pb2.ReferenceVoice, path: str, rate: int) -> VoiceSpec:
    """Decode and check a zero-shot reference clip: mono float32 at the model's rate."""
    import hashlib
    import io

    import soundfile as sf
    import soxr

    if not ref.audio:
        raise FieldError(f"{path}.audio", "must hold an audio file (WAV, FLAC or Ogg)")
    if len(ref.audio) > MAX_REFERENCE_BYTES:
        raise FieldError(
            f"{path}.audio", f"is {len(ref.audio)} bytes; the limit is {MAX_REFERENCE_BYTES}"
        )
    transcript = ref.transcript.strip()
    if not transcript or len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise FieldError(f"{path}.transcript", f"must be 1 to {MAX_TRANSCRIPT_CHARS} characters")
    try:
        with sf.SoundFile(io.BytesIO(ref.audio)) as f:
            if f.frames > MAX_REFERENCE_S * f.samplerate:
                raise FieldError(f"{path}.audio", f"is longer than {MAX_REFERENCE_S:g} s")
            audio = f.read(dtype="float32", always_2d=True)
            source_rate = f.samplerate
    except FieldError:
        raise
    except Exception:  # soundfile raises several types for undecodable bytes
        raise FieldError(f"{path}.audio", "is not a readable WAV, FLAC or Ogg file") from None
    mono = audio.mean(axis=1)
    if source_rate != rate:
        mono = soxr.resample(mono, source_rate, rate).astype(np.float32)
    if mono.size < rate // 2 or not np.isfinite(mono).all():
        raise FieldError(f"{path}.audio", "must hold at least 0.5 s of finite audio")
    pcm = np.ascontiguousarray(mono, dtype=np.float32).tobytes()
    return VoiceSpec(
        VoiceKind.REFERENCE,
        reference_pcm=pcm,
        reference_id=hashlib.sha256(pcm).hexdigest()[:16],
        transcript=transcript,
    )


def audio_chunk_pb(
    data: bytes, sample_offset: int, num_samples: int, utterance_index: int, audio: AudioOptions
) -> tts_pb2.AudioChunk:
    return tts_pb2.AudioChunk(
        audio=data,
        sample_offset=sample_offset,
        num_samples=num_samples,
        utterance_index=utterance_index,
        sample_rate_hz=audio.sample_rate_hz,
        encoding=ENCODING_VALUES[audio.encoding],
    )


def utterance_end_pb(
    done: UtteranceDone, utterance_index: int, native_rate: int
) -> tts_pb2.UtteranceEnd:
    return tts_pb2.UtteranceEnd(
        utterance_index=utterance_index,
        text=done.text,
        audio_duration_s=done.num_samples / native_rate,
        time_to_first_audio_s=done.time_to_first_audio_s,
        generation_time_s=done.generation_time_s,
        num_tokens=done.num_tokens,
        finish_reason=done.finish_reason,
    )
