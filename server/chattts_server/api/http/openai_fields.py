"""OpenAI's speech parameters in our terms: voices, speed levels, response formats.

Shared by `POST /v1/audio/speech` and the WebSocket, and documented in the README:

- `voice`: a preset of the voices folder; `seed:N` (a ChatTTS speaker seed); or one of
  OpenAI's voice names, each a fixed ChatTTS speaker seed (`OPENAI_VOICE_SEEDS`) so a client
  with a default voice works and always gets the same speaker. A preset named like an OpenAI
  voice (`voices/alloy.json`) takes its place.
- `speed` 0.25-4.0 -> ChatTTS `[speed_N]`, N = clamp(round(5 + 2.5 * log2(speed)), 0, 9):
  1.0 is level 5 (ChatTTS's default), each doubling 2.5 levels faster (`speed_level`).
- `response_format` -> our encodings (`FORMAT_ENCODINGS`), all mono at 24 kHz by default.
"""

from __future__ import annotations

import math

from chattts_proto.chattts.v1 import tts_pb2

from ...voices import VoiceLibrary
from ..convert import FieldError

# Fixed speakers for OpenAI's built-in voice names (ChatTTS speaker seeds).
OPENAI_VOICE_SEEDS = {
    "alloy": 1001,
    "ash": 1002,
    "ballad": 1003,
    "coral": 1004,
    "echo": 1005,
    "fable": 1006,
    "onyx": 1007,
    "nova": 1008,
    "sage": 1009,
    "shimmer": 1010,
    "verse": 1011,
    "marin": 1012,
    "cedar": 1013,
}

# response_format -> (encoding name for Session, Content-Type)
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
        raise FieldError(param, "must be a number")
    speed = float(value)
    low, high = SPEED_RANGE
    if not math.isfinite(speed) or not low <= speed <= high:
        raise FieldError(param, f"must be in [{low:g}, {high:g}], got {speed:g}")
    return speed


def resolve_voice(value: object, voices: VoiceLibrary, param: str = "voice") -> tts_pb2.Voice:
    """A voice name as OpenAI clients send it (a string, or `{"id": name}`) as a tts.proto Voice."""
    if isinstance(value, dict) and set(value) == {"id"}:
        value, param = value["id"], f"{param}.id"
    if not isinstance(value, str) or not value:
        raise FieldError(param, 'must be a voice name, seed:N, or {"id": name}')
    name = value.strip()
    if name.startswith("seed:"):
        digits = name[len("seed:") :]
        if not digits.isdigit() or int(digits) >= _MAX_SEED:
            raise FieldError(param, f"seed must be an integer in [0, 2^32), got {digits[:20]!r}")
        return tts_pb2.Voice(seed=int(digits))
    name = name.removeprefix("preset:")
    if voices.get(name) is not None:
        return tts_pb2.Voice(preset=name)
    if name.lower() in OPENAI_VOICE_SEEDS:
        return tts_pb2.Voice(seed=OPENAI_VOICE_SEEDS[name.lower()])
    known = [p.name for p in voices.list()] + sorted(OPENAI_VOICE_SEEDS)
    raise FieldError(param, f"unknown voice {name[:64]!r} (known: {', '.join(known)}; or seed:N)")
