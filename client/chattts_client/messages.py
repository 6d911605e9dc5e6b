"""Messages in and out, as plain Python: response events and request configs.

One place converts between the generated protobuf messages and what callers handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from chattts_proto.chattts.v1 import tts_pb2

# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AudioChunkEvent:
    """A chunk of audio; see `chattts.v1.AudioChunk`."""

    audio: bytes
    sample_offset: int  # first sample of this chunk in the whole stream
    num_samples: int
    utterance_index: int
    sample_rate_hz: int
    encoding: str  # AudioEncoding name, e.g. "LINEAR16"; UNSPECIFIED reads as "LINEAR16"

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate_hz if self.sample_rate_hz else 0.0


@dataclass(frozen=True)
class UtteranceEndEvent:
    """Sent after the last chunk of an utterance; timings are measured by the server."""

    utterance_index: int
    text: str
    audio_duration_s: float
    time_to_first_audio_s: float
    generation_time_s: float
    num_tokens: int
    finish_reason: str


Event = AudioChunkEvent | UtteranceEndEvent


@dataclass(frozen=True)
class Clear:
    """Barge-in, as an item of a streamed text: the server drops its buffered text, stops the
    utterance being spoken (it ends with finish_reason "cleared") and then speaks `text`."""

    text: str = ""


@dataclass(frozen=True)
class Flush:
    """An item of a streamed text: `text`, then synthesize everything buffered now, even
    without a sentence end (an agent's end of turn)."""

    text: str = ""


StreamItem = str | Clear | Flush
"""What a streamed text is made of."""


def text_input(item: StreamItem, flush: bool = False) -> tts_pb2.StreamingSynthesizeRequest:
    """The request message for one streamed text (or `Clear`, or `Flush`)."""
    if isinstance(item, Clear):
        return tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text=item.text, flush=flush, clear=True)
        )
    if isinstance(item, Flush):
        return tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text=item.text, flush=True)
        )
    return tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=item, flush=flush))


@dataclass(frozen=True)
class VoiceInfo:
    """A named voice (preset) the server offers."""

    name: str
    description: str


def event_from_pb(
    response: tts_pb2.SynthesizeResponse | tts_pb2.StreamingSynthesizeResponse,
) -> Event:
    """Convert a Synthesize or StreamingSynthesize response into an event."""
    kind = response.WhichOneof("response")
    if kind == "audio":
        a = response.audio
        encoding = a.encoding or tts_pb2.LINEAR16
        return AudioChunkEvent(
            audio=a.audio,
            sample_offset=a.sample_offset,
            num_samples=a.num_samples,
            utterance_index=a.utterance_index,
            sample_rate_hz=a.sample_rate_hz,
            encoding=tts_pb2.AudioEncoding.Name(encoding),
        )
    if kind == "utterance_end":
        u = response.utterance_end
        return UtteranceEndEvent(
            utterance_index=u.utterance_index,
            text=u.text,
            audio_duration_s=u.audio_duration_s,
            time_to_first_audio_s=u.time_to_first_audio_s,
            generation_time_s=u.generation_time_s,
            num_tokens=u.num_tokens,
            finish_reason=u.finish_reason,
        )
    raise ValueError(f"response carries no event (oneof is {kind!r})")


# --- config ---------------------------------------------------------------------------------


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
) -> tts_pb2.SynthesisConfig:
    """Build a SynthesisConfig; None leaves a field unset (the server's default).

    `voice` is parsed by `parse_voice`, `encoding` by `parse_encoding`. Values are range-checked
    by the server, which answers INVALID_ARGUMENT naming the field. `reference_audio` (an audio
    file's bytes) with its `reference_transcript` asks for a zero-shot voice instead of `voice`.
    """
    config = tts_pb2.SynthesisConfig()
    if voice is not None and reference_audio is not None:
        raise ValueError("give either voice or reference_audio, not both")
    if voice is not None:
        config.voice.CopyFrom(parse_voice(voice))
    if reference_audio is not None:
        config.voice.reference.audio = reference_audio
        config.voice.reference.transcript = reference_transcript
    config.audio_format.encoding = parse_encoding(encoding)
    config.audio_format.sample_rate_hz = sample_rate_hz
    if speed is not None:
        config.prosody.speed = speed
    if refine_text:
        config.prosody.refine_text = True
    sampling = config.sampling
    for name, value in (
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("seed", seed),
        ("max_new_tokens", max_new_tokens),
        ("min_new_tokens", min_new_tokens),
    ):
        if value is not None:
            setattr(sampling, name, value)
    return config
