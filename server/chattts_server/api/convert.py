"""Protobuf <-> domain conversion and request validation.

Everything a client sends passes through here before it reaches the engine. A bad value raises
`InvalidRequestError` (errors.py) naming the field as the client spelled it
(`config.sampling.top_p`), which every door answers as INVALID_ARGUMENT / 400 naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from chattts_proto.chattts.v1 import tts_pb2

from ..audio.encoding import PYAV_ENCODINGS, SUPPORTED_SAMPLE_RATES
from ..engine.protocol import ModelInfo
from ..engine.utterance import (
    DEFAULT_SPEED,
    ChunkingOptions,
    Priority,
    RefineOptions,
    SamplingParams,
    VoiceSpec,
)
from ..errors import InvalidRequestError
from ..stream.catch_up import (
    DEFAULT_MAX_SPEED,
    MAX_LAG_S,
    MAX_PACE_LEAD_S,
    MIN_LAG_S,
    MIN_PACE_LEAD_S,
    LagLimits,
)
from ..stream.settings import AudioOptions, StreamSettings
from ..text import control_tokens
from ..text.duration import max_segment_s
from ..text.lexicon_library import LexiconLibrary
from ..text.release import ReleasePolicy
from .lexicons import stream_lexicons
from .voices import VoiceLibrary, voice_spec

ENCODING_NAMES = {
    tts_pb2.AUDIO_ENCODING_UNSPECIFIED: "LINEAR16",
    tts_pb2.LINEAR16: "LINEAR16",
    tts_pb2.MULAW: "MULAW",
    tts_pb2.ALAW: "ALAW",
    tts_pb2.OGG_OPUS: "OGG_OPUS",
    tts_pb2.FLOAT32: "FLOAT32",
}
ENCODING_VALUES = {name: value for value, name in ENCODING_NAMES.items() if value}
PRIORITIES: dict[int, Priority] = {
    tts_pb2.PRIORITY_UNSPECIFIED: Priority.DEFAULT,
    tts_pb2.PRIORITY_INTERACTIVE: Priority.INTERACTIVE,
    tts_pb2.PRIORITY_DEFAULT: Priority.DEFAULT,
    tts_pb2.PRIORITY_BULK: Priority.BULK,
}
"""tts.proto's Priority -> ours (unset is DEFAULT)."""


@dataclass(frozen=True)
class Validator:
    """Validates requests against the server's limits and the loaded model."""

    voices: VoiceLibrary
    model: ModelInfo
    """The loaded model: speaker size, sample rate, code vocabulary, token ceiling."""
    max_text_chars: int = 4000
    encodings: tuple[str, ...] = ("LINEAR16",)
    """What this server can write (`available_encodings`: the one capability check)."""
    server_lexicons: LexiconLibrary = field(default_factory=LexiconLibrary)
    """The server's pronunciation lexicons (--lexicon), which a stream may name."""

    def text(self, text: str, field_name: str, allow_empty: bool = False) -> str:
        if len(text) > self.max_text_chars:
            raise InvalidRequestError(
                field_name, f"is {len(text)} characters; the limit is {self.max_text_chars}"
            )
        if not allow_empty and not text.strip():
            raise InvalidRequestError(field_name, "must not be empty or whitespace only")
        if "\x00" in text:
            raise InvalidRequestError(field_name, "must not contain NUL characters")
        try:
            control_tokens.check(text)
        except ValueError as exc:
            raise InvalidRequestError(field_name, str(exc)) from None
        return text

    def settings(self, config: tts_pb2.SynthesisConfig, prefix: str = "config") -> StreamSettings:
        return StreamSettings(
            voice=voice_spec(config.voice, f"{prefix}.voice", self.voices, self.model)
            if config.HasField("voice")
            else VoiceSpec(),
            speed=self._speed(config.prosody, f"{prefix}.prosody"),
            refine=self._refine(config.prosody, f"{prefix}.prosody"),
            sampling=self._sampling(config.sampling, f"{prefix}.sampling"),
            audio=self._audio(config.audio_format, f"{prefix}.audio_format"),
            chunking=self._chunking(config.chunking, f"{prefix}.chunking"),
            text_release=self._text_release(config, prefix),
            ssml=config.text_format == tts_pb2.SSML,
            ssml_ignore_unknown=config.ssml_ignore_unknown_elements,
            markdown=self._markdown(config.text_format, f"{prefix}.text_format"),
            word_timing=config.word_timing,
            priority=self._priority(config.priority, f"{prefix}.priority"),
            lexicons=stream_lexicons(config.lexicons, self.server_lexicons, f"{prefix}.lexicons"),
            server_lexicons=self.server_lexicons,
            lag_limits=self._lag_limits(config, prefix),
            pace_lead_s=self._pace_lead_s(config, prefix),
        )

    @staticmethod
    def _pace_lead_s(config: tts_pb2.SynthesisConfig, prefix: str) -> float | None:
        if not config.HasField("pace_lead_s"):
            return None
        lead = config.pace_lead_s
        if not (math.isfinite(lead) and MIN_PACE_LEAD_S <= lead <= MAX_PACE_LEAD_S):
            raise InvalidRequestError(
                f"{prefix}.pace_lead_s",
                f"must be {MIN_PACE_LEAD_S:g} to {MAX_PACE_LEAD_S:g} s, got {lead:g}",
            )
        return lead

    @staticmethod
    def _lag_limits(config: tts_pb2.SynthesisConfig, prefix: str) -> LagLimits | None:
        """max_lag_s, hard_lag_s and catch_up_max_speed; None when max_lag_s is unset or 0."""
        soft = config.max_lag_s if config.HasField("max_lag_s") else 0.0
        if config.HasField("hard_lag_s") and not soft:
            raise InvalidRequestError(f"{prefix}.hard_lag_s", "needs max_lag_s")
        if not soft:
            return None
        if not (math.isfinite(soft) and MIN_LAG_S <= soft <= MAX_LAG_S):
            raise InvalidRequestError(
                f"{prefix}.max_lag_s", f"must be {MIN_LAG_S:g} to {MAX_LAG_S:g} s, got {soft:g}"
            )
        hard = config.hard_lag_s if config.HasField("hard_lag_s") else 2 * soft
        if not (math.isfinite(hard) and soft <= hard <= 2 * MAX_LAG_S):
            raise InvalidRequestError(
                f"{prefix}.hard_lag_s",
                f"must be max_lag_s ({soft:g} s) to {2 * MAX_LAG_S:g} s, got {hard:g}",
            )
        top = DEFAULT_MAX_SPEED
        if config.HasField("catch_up_max_speed"):
            top = config.catch_up_max_speed
            if top > 9:
                raise InvalidRequestError(
                    f"{prefix}.catch_up_max_speed", f"must be 0 to 9, got {top}"
                )
        return LagLimits(soft, hard, top)

    @staticmethod
    def _priority(value: int, path: str) -> Priority:
        if value not in PRIORITIES:
            raise InvalidRequestError(path, f"unknown priority value {value}")
        return PRIORITIES[value]

    def _chunking(self, pb: tts_pb2.Chunking, path: str) -> ChunkingOptions:
        """The request's own chunk schedule, checked against the server's (`ModelInfo`)."""
        names = ("first_chunk_tokens", "max_chunk_tokens", "lookahead_tokens")
        options = ChunkingOptions(**{n: getattr(pb, n) for n in names if pb.HasField(n)})
        try:
            options.check(self.model.chunking)
        except ValueError as exc:
            name, _, description = str(exc).partition(" ")
            raise InvalidRequestError(f"{path}.{name}", description) from None
        return options

    @staticmethod
    def _markdown(text_format: int, path: str) -> bool:
        """Whether the text is markdown (the default); InvalidRequestError for a value that
        names no format."""
        if text_format not in tts_pb2.TextFormat.values():
            raise InvalidRequestError(path, f"unknown text format value {text_format}")
        return text_format not in (tts_pb2.PLAIN, tts_pb2.SSML)

    def _text_release(self, config: tts_pb2.SynthesisConfig, prefix: str) -> ReleasePolicy:
        """The stream's release policy; its duration budget comes from the server's per-utterance
        token ceiling (not the stream's own max_new_tokens, which only truncates)."""
        pb, d = config.text_release, ReleasePolicy()
        values = {}
        for name in ("clause_min_words", "max_words", "idle_ms", "first_words"):
            values[name] = getattr(pb, name) if pb.HasField(name) else getattr(d, name)
        policy = ReleasePolicy(
            **values,
            max_segment_s=max_segment_s(self.model.max_new_tokens),
            speed=self._speed(config.prosody, f"{prefix}.prosody"),
        )
        try:
            policy.check()
        except ValueError as exc:
            name, _, description = str(exc).partition(" ")
            raise InvalidRequestError(f"{prefix}.text_release.{name}", description) from None
        return policy

    @staticmethod
    def _finite(value: float, path: str, low: float, high: float, low_open: bool = False) -> float:
        if not math.isfinite(value):
            raise InvalidRequestError(path, "must be a finite number")
        if value > high or value < low or (low_open and value == low):
            bracket = "(" if low_open else "["
            raise InvalidRequestError(
                path, f"must be in {bracket}{low:g}, {high:g}], got {value:g}"
            )
        return value

    def _speed(self, prosody: tts_pb2.Prosody, path: str) -> int:
        if not prosody.HasField("speed"):
            return DEFAULT_SPEED
        return round(self._finite(prosody.speed, f"{path}.speed", 0, 9))

    def _refine(self, prosody: tts_pb2.Prosody, path: str) -> RefineOptions:
        def level(name: str, default: int, high: int) -> int:
            if not prosody.HasField(name):
                return default
            value = getattr(prosody, name)
            if value > high:
                raise InvalidRequestError(f"{path}.{name}", f"must be in [0, {high}], got {value}")
            return int(value)

        d, top = RefineOptions(), control_tokens.LEVEL_CONTROLS
        return RefineOptions(
            enabled=prosody.refine_text,
            oral=level("oral", d.oral, top["oral"]),
            laugh=level("laugh", d.laugh, top["laugh"]),
            break_level=level("break_level", d.break_level, top["break"]),
        )

    def _sampling(self, s: tts_pb2.Sampling, path: str) -> SamplingParams:
        d = SamplingParams()
        ceiling = self.model.max_new_tokens
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
            num_codes = self.model.num_audio_codes
            if not 1 <= s.top_k <= num_codes:
                raise InvalidRequestError(
                    f"{path}.top_k", f"must be in [1, {num_codes}], got {s.top_k}"
                )
            top_k = s.top_k
        max_new = d.max_new_tokens
        if s.HasField("max_new_tokens"):
            if not 1 <= s.max_new_tokens <= ceiling:
                raise InvalidRequestError(
                    f"{path}.max_new_tokens", f"must be in [1, {ceiling}], got {s.max_new_tokens}"
                )
            max_new = s.max_new_tokens
        min_new = 0
        if s.HasField("min_new_tokens"):
            if s.min_new_tokens > (max_new or ceiling):
                raise InvalidRequestError(
                    f"{path}.min_new_tokens", f"must be <= max_new_tokens ({max_new or ceiling})"
                )
            min_new = s.min_new_tokens
        return SamplingParams(
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
            raise InvalidRequestError(f"{path}.encoding", f"unknown encoding value {fmt.encoding}")
        encoding = self.encoding(ENCODING_NAMES[fmt.encoding], f"{path}.encoding")
        rate = fmt.sample_rate_hz or self.model.sample_rate
        if rate not in SUPPORTED_SAMPLE_RATES:
            rates = ", ".join(str(r) for r in SUPPORTED_SAMPLE_RATES)
            raise InvalidRequestError(
                f"{path}.sample_rate_hz", f"must be 0 or one of {rates}, got {rate}"
            )
        return AudioOptions(encoding=encoding, sample_rate_hz=rate)

    def encoding(self, encoding: str, field_name: str, asked_as: str | None = None) -> str:
        """`encoding` if this server can write it, else InvalidRequestError naming the field
        (`asked_as`: the name the client used, e.g. OpenAI's `mp3`)."""
        if encoding in self.encodings:
            return encoding
        asked = encoding if asked_as is None else f"{asked_as} ({encoding})"
        why = (
            "it needs PyAV (the av package), not installed here"
            if encoding in PYAV_ENCODINGS
            else "unknown"
        )
        raise InvalidRequestError(
            field_name,
            f"{asked} is not available on this server: {why} (available: {', '.join(self.encodings)})",
        )
