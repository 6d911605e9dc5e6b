"""What a call asks for: the `SynthesisConfig` of its voice, speed, sampling, audio format,
word timing and pacing, built from keywords (`make_config`) or from a `SynthesisOptions` value.

`SynthesisOptions` checks itself when built, so a bad option fails where it was written, not at
the first call; the voice-agent adapters take it instead of repeating its fields as keywords.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

from chattts_proto.chattts.v1 import tts_pb2


@dataclass(frozen=True)
class SynthesisOptions:
    """The arguments of `make_config`, and the pronunciation lexicons of a call.

    None leaves a field to the server's default; the server range-checks values and answers
    INVALID_ARGUMENT naming the field. `to_config()` builds the SynthesisConfig;
    `dataclasses.replace(options, ...)` makes a variant.
    """

    voice: str | int | None = None  # see `parse_voice`: a seed, "emb:...", a preset's name
    speed: float | None = None  # speed level 0..9
    refine_text: bool = False  # run ChatTTS refine-text first
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None  # sampling seed
    encoding: str | int = "LINEAR16"  # see `parse_encoding`
    sample_rate_hz: int = 0  # 0: the model's own rate
    max_new_tokens: int | None = None  # audio tokens per sentence, at most
    min_new_tokens: int | None = None  # audio tokens per sentence, at least
    # An audio file's bytes and what is said in it: a zero-shot voice, instead of `voice`.
    reference_audio: bytes | None = None
    reference_transcript: str = ""
    word_timing: bool = False  # a `WordTimingsEvent` per utterance (captions, what was heard)
    # Each a server lexicon's name or a W3C PLS document (`lexicon_value` reads a file's).
    lexicons: tuple[str, ...] = ()
    # A caption stream's lag kept bounded: over `max_lag_s` utterances are sped up, over
    # `hard_lag_s` (default twice it) skipped.
    max_lag_s: float | None = None
    hard_lag_s: float | None = None
    # Audio sent at most this far ahead of real-time playback (navigation: a CUT replace then
    # finds the prompt still speaking).
    pace_lead_s: float | None = None

    def __post_init__(self) -> None:
        self.to_config()  # parse errors (voice, encoding, voice with reference) fail here

    def to_config(self, **changes: Any) -> tts_pb2.SynthesisConfig:
        """The SynthesisConfig of these options, with `changes` (field=value) applied."""
        options = replace(self, **changes) if changes else self
        names = [f.name for f in fields(options) if f.name != "lexicons"]
        config = make_config(**{name: getattr(options, name) for name in names})
        config.lexicons.extend(options.lexicons)
        return config


def make_config(
    voice: str | int | None = None,
    speed: float | None = None,
    refine_text: bool = False,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    encoding: str | int = "LINEAR16",
    sample_rate_hz: int = 0,
    max_new_tokens: int | None = None,
    min_new_tokens: int | None = None,
    reference_audio: bytes | None = None,
    reference_transcript: str = "",
    word_timing: bool = False,
    max_lag_s: float | None = None,
    hard_lag_s: float | None = None,
    pace_lead_s: float | None = None,
) -> tts_pb2.SynthesisConfig:
    """Build a SynthesisConfig; None leaves a field unset (the server's default). Each argument
    is the `SynthesisOptions` field of the same name (see there)."""
    config = tts_pb2.SynthesisConfig()
    _set_voice(config.voice, voice, reference_audio, reference_transcript)
    config.audio_format.encoding = parse_encoding(encoding)
    config.audio_format.sample_rate_hz = sample_rate_hz
    _set_given(config.prosody, speed=speed, refine_text=refine_text or None)
    _set_given(
        config,
        word_timing=word_timing or None,
        max_lag_s=max_lag_s,
        hard_lag_s=hard_lag_s,
        pace_lead_s=pace_lead_s,
    )
    _set_given(
        config.sampling,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
    )
    return config


def _set_voice(
    message: tts_pb2.Voice, voice: str | int | None, reference_audio: bytes | None, transcript: str
) -> None:
    if voice is not None and reference_audio is not None:
        raise ValueError("give either voice or reference_audio, not both")
    if voice is not None:
        message.CopyFrom(parse_voice(voice))
    elif reference_audio is not None:
        message.reference.audio = reference_audio
        message.reference.transcript = transcript


def _set_given(message: Any, **values: Any) -> None:
    """Set the fields whose value is not None (the others keep the server's default)."""
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)


def parse_voice(voice: str | int) -> tts_pb2.Voice:
    """Parse a voice spec.

    "seed:1234", "1234" or an int give a speaker seed; "emb:STRING" a speaker embedding;
    "preset:NAME" or a bare name a preset.
    """
    if isinstance(voice, int):
        return _seed_voice(voice)
    spec = voice.strip()
    if not spec:
        raise ValueError("voice: empty")
    kind, sep, rest = spec.partition(":")
    if sep and kind == "seed":
        try:
            return _seed_voice(int(rest))
        except ValueError:
            raise ValueError(f"voice: bad seed {rest!r}") from None
    if sep and kind == "emb":
        if not rest:
            raise ValueError("voice: empty speaker embedding")
        return tts_pb2.Voice(speaker_embedding=rest)
    if sep and kind == "preset":
        if not rest:
            raise ValueError("voice: empty preset name")
        return tts_pb2.Voice(preset=rest)
    if spec.isdigit():
        return _seed_voice(int(spec))
    return tts_pb2.Voice(preset=spec)


def _seed_voice(seed: int) -> tts_pb2.Voice:
    if not 0 <= seed < 2**32:
        raise ValueError(f"voice: seed {seed} outside [0, 2**32)")
    return tts_pb2.Voice(seed=seed)


def parse_encoding(encoding: str | int) -> tts_pb2.AudioEncoding:
    """An AudioEncoding value from its name (any case, e.g. "ogg_opus") or number."""
    if isinstance(encoding, int):
        tts_pb2.AudioEncoding.Name(encoding)  # raises ValueError when unknown
        return cast(tts_pb2.AudioEncoding, encoding)
    try:
        return cast(tts_pb2.AudioEncoding, tts_pb2.AudioEncoding.Value(encoding.strip().upper()))
    except ValueError:
        names = ", ".join(n.lower() for n in tts_pb2.AudioEncoding.keys()[1:])
        raise ValueError(f"encoding: unknown {encoding!r}; one of {names}") from None


def lexicon_value(file_or_name: str) -> str:
    """A `SynthesisConfig.lexicons` value: a W3C PLS file's text when `file_or_name` is a file
    (sent inline), else the name of a lexicon the server loaded (its file's base name without
    .pls). What looks like a path (a / or a .pls or .xml ending) but is no file is an OSError
    here, not an unknown name at the server."""
    path = Path(file_or_name)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "/" in file_or_name or os.sep in file_or_name or path.suffix in (".pls", ".xml"):
        raise FileNotFoundError(f"no lexicon file {file_or_name}")
    return file_or_name
