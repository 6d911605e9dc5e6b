"""Messages in and out, as plain Python: response events and request configs.

One place converts between the generated protobuf messages and what callers handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from chattts_proto.chattts.v1 import tts_pb2

MODEL_SAMPLE_RATE_HZ = 24000
"""The model's own output rate: what a stream's audio is at unless `sample_rate_hz` asks for
another, and what a reader assumes before the first chunk tells the real rate."""

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
    # Where the utterance lies in the stream's audio (at the chunks' rate): its first sample and
    # the samples of it that were sent (for a "cleared" one, up to the cut). Both 0 from a
    # server older than the timeline.
    sample_offset: int = 0
    num_samples: int = 0
    # The caller's own text of the utterance ("200 m", not "two hundred meters") and where it
    # lies in the text sent on the stream, in code points: [source_start, source_end).
    source_text: str = ""
    source_start: int = 0
    source_end: int = 0
    # Seconds from its first text reaching the server to its first audio being heard by a
    # real-time listener, and the speed level it was spoken at (raised by max_lag_s).
    lag_s: float = 0.0
    speed: int = 0


@dataclass(frozen=True)
class MarkEvent:
    """The answer to a mark (`Mark` item, or `text_input(..., mark=)`): the stream's audio
    offset right after the last audio of the text before it. `dropped`: a clear dropped that
    text before it was all spoken, and the offset is where the stream was cut."""

    name: str
    sample_offset: int
    offset_s: float
    dropped: bool


@dataclass(frozen=True)
class WordTiming:
    """One spoken word (one character for Chinese and Japanese) and where it is in the audio."""

    text: str  # as spoken, after normalization ("two hundred meters")
    start_sample: int  # stream sample offsets [start_sample, end_sample), at the chunks' rate
    end_sample: int
    start_s: float
    end_s: float
    # The caller's text it came from, [source_start, source_end) in code points of the text
    # sent on the stream ("200 m"); all empty when `has_source` is False (a refine insert).
    source_start: int
    source_end: int
    source_text: str
    has_source: bool


@dataclass(frozen=True)
class WordTimingsEvent:
    """Words of one utterance with their timing (asked for with `make_config(word_timing=True)`).

    An utterance's words may come in more than one event (each batch follows the last), all
    before its UtteranceEnd. `source` is how they were obtained: "TIMING_ESTIMATE" or
    "TIMING_MODEL_ATTENTION".
    """

    utterance_index: int
    words: tuple[WordTiming, ...]
    source: str


@dataclass(frozen=True)
class SegmentEndEvent:
    """The one answer to a segment's revision (`Segment`, `Replace`): how it ended
    ("spoken", "replaced", "cut", "expired", "not_spoken") and the stream offset where its
    audio ends (where it was cut, for "cut")."""

    name: str
    revision: int
    outcome: str
    sample_offset: int
    offset_s: float
    text: str


Event = AudioChunkEvent | UtteranceEndEvent | MarkEvent | WordTimingsEvent | SegmentEndEvent


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


@dataclass(frozen=True)
class Mark:
    """An item of a streamed text: `text`, then a mark called `name` (1 to 256 characters) at
    the end of everything sent so far. The server answers it with a `MarkEvent` once the audio
    of the text before it has been sent: e.g. the end of an agent's turn. Like a flush, a mark
    ends the text before it."""

    name: str
    text: str = ""


@dataclass(frozen=True)
class Segment:
    """An item of a streamed text: `text` named `name`, so it can be replaced (`Replace`) and
    expire: it may wait at most `expires_in_ms` for its first audio (0: no limit) or is never
    spoken. A segment starts a new utterance; it runs to the next flush, mark, segment or
    replace. It ends with one `SegmentEndEvent`."""

    name: str
    text: str
    expires_in_ms: int = 0


IF_STARTED = {
    "finish": tts_pb2.FINISH,
    "cut": tts_pb2.CUT,
    "drop_new": tts_pb2.DROP_NEW,
}
"""`Replace.if_started` names -> tts.proto IfStarted."""


@dataclass(frozen=True)
class Replace:
    """An item of a streamed text: the segment `name` now says `text` (a navigation prompt's
    distance update). Not started yet: only `text` is spoken. Speaking: `if_started` decides,
    "finish" (the old text ends, then `text`), "cut" (the old text stops at its next word
    boundary, then `text`) or "drop_new" (`text` is not spoken)."""

    name: str
    text: str
    if_started: str = "finish"
    expires_in_ms: int = 0

    def __post_init__(self) -> None:
        if self.if_started not in IF_STARTED:
            raise ValueError(f"if_started must be one of {', '.join(IF_STARTED)}")


StreamItem = str | Clear | Flush | Mark | Segment | Replace
"""What a streamed text is made of."""


def text_input(
    item: StreamItem, flush: bool = False, mark: str = ""
) -> tts_pb2.StreamingSynthesizeRequest:
    """The request message for one streamed text (or `Clear`, `Flush`, `Mark`, `Segment`,
    `Replace`); `mark` names a mark placed after the item's text (after the cut, for a
    `Clear`)."""
    if isinstance(item, Mark):
        if mark:
            raise ValueError("a Mark item carries its own name; do not pass mark= with it")
        text, mark = item.text, item.name
    else:
        text = item if isinstance(item, str) else item.text
    message = tts_pb2.TextInput(
        text=text,
        flush=flush or isinstance(item, Flush),
        clear=isinstance(item, Clear),
        mark=mark,
    )
    if isinstance(item, Segment):
        message.segment = item.name
        message.expires_in_ms = item.expires_in_ms
    elif isinstance(item, Replace):
        message.replace = item.name
        message.if_started = IF_STARTED[item.if_started]
        message.expires_in_ms = item.expires_in_ms
    return tts_pb2.StreamingSynthesizeRequest(text=message)


def item_text(item: StreamItem) -> str:
    """The text an item sends: what the server's source offsets count in."""
    return item if isinstance(item, str) else item.text


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
            sample_offset=u.sample_offset,
            num_samples=u.num_samples,
            source_text=u.source_text,
            source_start=u.source_start,
            source_end=u.source_end,
            lag_s=u.lag_s,
            speed=u.speed,
        )
    if kind == "mark":
        m = response.mark
        return MarkEvent(
            name=m.name, sample_offset=m.sample_offset, offset_s=m.offset_s, dropped=m.dropped
        )
    if kind == "word_timings":
        return _word_timings_from_pb(response.word_timings)
    if kind == "segment_end" and isinstance(response, tts_pb2.StreamingSynthesizeResponse):
        e = response.segment_end
        return SegmentEndEvent(
            name=e.name,
            revision=e.revision,
            outcome=tts_pb2.SegmentOutcome.Name(e.outcome).removeprefix("SEGMENT_").lower(),
            sample_offset=e.sample_offset,
            offset_s=e.offset_s,
            text=e.text,
        )
    raise ValueError(f"response carries no event (oneof is {kind!r})")


def _word_timings_from_pb(timings: tts_pb2.WordTimings) -> WordTimingsEvent:
    return WordTimingsEvent(
        utterance_index=timings.utterance_index,
        words=tuple(
            WordTiming(
                text=w.text,
                start_sample=w.start_sample,
                end_sample=w.end_sample,
                start_s=w.start_s,
                end_s=w.end_s,
                source_start=w.source_start,
                source_end=w.source_end,
                source_text=w.source_text,
                has_source=w.has_source,
            )
            for w in timings.words
        ),
        source=tts_pb2.TimingSource.Name(timings.source),
    )


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
    word_timing: bool = False,
    max_lag_s: float | None = None,
    hard_lag_s: float | None = None,
    pace_lead_s: float | None = None,
) -> tts_pb2.SynthesisConfig:
    """Build a SynthesisConfig; None leaves a field unset (the server's default).

    `voice` is parsed by `parse_voice`, `encoding` by `parse_encoding`. Values are range-checked
    by the server, which answers INVALID_ARGUMENT naming the field. `reference_audio` (an audio
    file's bytes) with its `reference_transcript` asks for a zero-shot voice instead of `voice`.
    `word_timing` asks for a `WordTimingsEvent` per utterance (captions, what was heard).
    `max_lag_s` keeps a caption stream's lag bounded: over it utterances are sped up, over
    `hard_lag_s` (default twice it) skipped. `pace_lead_s` has the server send audio at most
    that far ahead of real-time playback (navigation: a CUT replace then finds the prompt
    still speaking).
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
    if word_timing:
        config.word_timing = True
    if max_lag_s is not None:
        config.max_lag_s = max_lag_s
    if hard_lag_s is not None:
        config.hard_lag_s = hard_lag_s
    if pace_lead_s is not None:
        config.pace_lead_s = pace_lead_s
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
