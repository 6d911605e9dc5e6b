"""OpenAI's speech parameters in our terms: voices, speed levels, response formats.

`openai_settings` is the one mapping of them onto StreamSettings, for `POST /v1/audio/speech`
and the WebSocket both, through the gRPC Validator; documented in docs/api.md:

- `voice`: a preset of the voices folder; `seed:N` (a ChatTTS speaker seed); or one of
  OpenAI's voice names, each a fixed ChatTTS speaker seed (`OPENAI_VOICE_SEEDS`) so a client
  with a default voice works and always gets the same speaker. A preset named like an OpenAI
  voice (`voices/alloy.json`) takes its place.
- `speed` 0.25-4.0 -> ChatTTS `[speed_N]`, N = clamp(round(5 + 2.5 * log2(speed)), 0, 9):
  1.0 is level 5 (ChatTTS's default), each doubling 2.5 levels faster (`speed_level`).
- `response_format` -> our encodings (`FORMAT_ENCODINGS`), all mono at the model's rate by
  default; one this server cannot write (mp3, aac, flac, opus without PyAV) is refused naming
  the parameter, by the Validator's one capability check.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from google.protobuf import json_format

from chattts_proto.chattts.v1 import tts_pb2

from ...engine.utterance import Priority
from ...errors import InvalidRequestError
from ...stream.settings import StreamSettings
from ..convert import Validator
from ..voices import VoiceLibrary

_OPENAI_VOICES = "alloy ash ballad coral echo fable onyx nova sage shimmer verse marin cedar"
OPENAI_VOICE_SEEDS = {name: 1001 + i for i, name in enumerate(_OPENAI_VOICES.split())}
"""Fixed speakers for OpenAI's built-in voice names (ChatTTS speaker seeds 1001, 1002, ...)."""

# response_format -> (encoding name for the stream, Content-Type)
FORMAT_ENCODINGS = {
    "pcm": ("LINEAR16", "audio/L16; rate={rate}; channels=1"),
    "wav": ("WAV", "audio/wav"),
    "opus": ("OGG_OPUS", "audio/ogg; codecs=opus"),
    "mp3": ("MP3", "audio/mpeg"),
    "flac": ("FLAC", "audio/flac"),
    "aac": ("AAC", "audio/aac"),
}
SPEED_RANGE = (0.25, 4.0)
_MAX_SEED = 2**32


def speed_level(speed: float) -> int:
    """OpenAI's speed multiplier as a ChatTTS speed level, 0 (slowest) to 9."""
    return max(0, min(9, math.floor(5 + 2.5 * math.log2(speed) + 0.5)))


def check_speed(value: object, param: str = "speed") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(param, "must be a number")
    speed = float(value)
    low, high = SPEED_RANGE
    if not math.isfinite(speed) or not low <= speed <= high:
        raise InvalidRequestError(param, f"must be in [{low:g}, {high:g}], got {speed:g}")
    return speed


def resolve_voice(value: object, voices: VoiceLibrary, param: str = "voice") -> tts_pb2.Voice:
    """A voice name as OpenAI clients send it (a string, or `{"id": name}`) as a tts.proto Voice."""
    if isinstance(value, dict) and set(value) == {"id"}:
        value, param = value["id"], f"{param}.id"
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(param, 'must be a voice name, seed:N, or {"id": name}')
    name = value.strip()
    if name.startswith("seed:"):
        digits = name[len("seed:") :]
        if not digits.isdigit() or int(digits) >= _MAX_SEED:
            raise InvalidRequestError(
                param, f"seed must be an integer in [0, 2^32), got {digits[:20]!r}"
            )
        return tts_pb2.Voice(seed=int(digits))
    name = name.removeprefix("preset:")
    if voices.get(name) is not None:
        return tts_pb2.Voice(preset=name)
    if name.lower() in OPENAI_VOICE_SEEDS:
        return tts_pb2.Voice(seed=OPENAI_VOICE_SEEDS[name.lower()])
    known = [p.name for p in voices.list()] + sorted(OPENAI_VOICE_SEEDS)
    raise InvalidRequestError(
        param, f"unknown voice {name[:64]!r} (known: {', '.join(known)}; or seed:N)"
    )


def synthesis_config(value: Any, field_name: str) -> tts_pb2.SynthesisConfig:
    """A tts.proto SynthesisConfig in its JSON form (None: the defaults); the JSON was
    checked for depth and text already (client_json)."""
    config = tts_pb2.SynthesisConfig()
    if value is None:
        return config
    if not isinstance(value, dict):
        raise InvalidRequestError(field_name, "must be a SynthesisConfig as a JSON object")
    value = _priority_shorthand(value, field_name)
    try:
        json_format.ParseDict(value, config)
    except json_format.ParseError as exc:
        raise InvalidRequestError(field_name, str(exc)[:300]) from None
    except (OverflowError, ValueError, TypeError) as exc:
        # protobuf's parser lets these through for some values: an enum given as Infinity
        # (JSON allows it; int(inf) overflows) is not a ParseError.
        raise InvalidRequestError(field_name, f"holds a value out of range: {exc}"[:300]) from None
    return config


def _priority_shorthand(value: dict[str, Any], field_name: str) -> dict[str, Any]:
    """`"priority": "interactive"` (or default, bulk) as well as the enum's own
    `PRIORITY_INTERACTIVE`; anything else that is a string is refused naming the field."""
    priority = value.get("priority")
    if not isinstance(priority, str):
        return value  # absent, or a number: ParseDict checks it
    names = [p.label for p in Priority]
    if priority in names:
        return {**value, "priority": f"PRIORITY_{priority.upper()}"}
    if priority in list(tts_pb2.Priority.keys()):
        return value
    raise InvalidRequestError(
        f"{field_name}.priority", f"must be one of {', '.join(names)}, got {priority[:20]!r}"
    )


def openai_settings(
    validator: Validator,
    voices: VoiceLibrary,
    config: tts_pb2.SynthesisConfig,
    prefix: str,
    *,
    voice: object = None,
    voice_param: str = "voice",
    speed: float | None = None,
    response_format: str | None = None,
    format_param: str = "response_format",
) -> StreamSettings:
    """The stream settings of a SynthesisConfig (validated as on gRPC, fields named under
    `prefix`) with OpenAI's fields on top: `voice` and `speed` where the config sets none,
    `response_format` as the encoding (InvalidRequestError naming `format_param` when it is
    unknown or this server cannot write it)."""
    if voice is not None and not config.HasField("voice"):
        config.voice.CopyFrom(resolve_voice(voice, voices, voice_param))
    if speed is not None and not config.prosody.HasField("speed"):
        config.prosody.speed = speed_level(speed)
    settings = validator.settings(config, prefix=prefix)
    if response_format is None:
        return settings
    if response_format not in FORMAT_ENCODINGS:
        raise InvalidRequestError(
            format_param,
            f"must be one of {', '.join(FORMAT_ENCODINGS)}, got {response_format[:20]!r}",
        )
    encoding = validator.encoding(
        FORMAT_ENCODINGS[response_format][0], format_param, response_format
    )
    return replace(settings, audio=replace(settings.audio, encoding=encoding))


def content_type(response_format: str, sample_rate_hz: int) -> str:
    return FORMAT_ENCODINGS[response_format][1].format(rate=sample_rate_hz)
