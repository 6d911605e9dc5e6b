"""Messages in and out, as plain Python: the events a call answers with, and the items a
streamed text is made of.

One place converts between them and the generated protobuf messages; the config a call asks
for is built in chattts_client.config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

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
    # Every word of the text sent before this code point is wholly heard once this chunk is
    # (the server's estimate): where a lost stream goes on from, elsewhere. 0 from an old server.
    heard_source_end: int = 0

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


@dataclass(frozen=True)
class ResumedEvent:
    """A resumable stream's connection dropped and the stream went on
    (`AsyncTTSClient.open_stream`). Made by the client library, not sent by the server.

    On the same server (`new_stream` False): from the audio the listener had, no audio or event
    lost or repeated. On a new stream (the server was gone, or its window had passed): from
    the first word of the caller's text not wholly heard (`from_source`, the `from_word`-th
    word counting from 0), with the text not yet heard sent again; every offset after it is
    on the caller's one timeline, as if the stream had never broken. The listener hears a gap
    and, at most, the start of that word twice."""

    gap_s: float  # from the failure to the answer of the call that goes on
    sample_offset: int  # the stream's samples received before it
    attempts: int  # the calls it took
    new_stream: bool = False
    from_source: int = 0  # code point of the caller's text the new stream starts from
    from_word: int = 0  # that word's index among the text's whitespace-separated words


Event = (
    AudioChunkEvent
    | UtteranceEndEvent
    | MarkEvent
    | WordTimingsEvent
    | SegmentEndEvent
    | ResumedEvent
)


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
        encoding = tts_pb2.AudioEncoding.Name(a.encoding or tts_pb2.LINEAR16)
        return _from_pb(AudioChunkEvent, a, encoding=encoding)
    if kind == "utterance_end":
        return _from_pb(UtteranceEndEvent, response.utterance_end)
    if kind == "mark":
        return _from_pb(MarkEvent, response.mark)
    if kind == "word_timings":
        t = response.word_timings
        words = tuple(_from_pb(WordTiming, w) for w in t.words)
        source = tts_pb2.TimingSource.Name(t.source)
        return _from_pb(WordTimingsEvent, t, words=words, source=source)
    if kind == "segment_end" and isinstance(response, tts_pb2.StreamingSynthesizeResponse):
        e = response.segment_end
        outcome = tts_pb2.SegmentOutcome.Name(e.outcome).removeprefix("SEGMENT_").lower()
        return _from_pb(SegmentEndEvent, e, outcome=outcome)
    raise ValueError(f"response carries no event (oneof is {kind!r})")


_E = TypeVar("_E")


def _from_pb(cls: type[_E], message: Any, **values: Any) -> _E:
    """A `cls` whose fields are the protobuf fields of the same names, but for `values`."""
    names = [f.name for f in fields(cls) if f.name not in values]  # type: ignore[arg-type]
    return cls(**{name: getattr(message, name) for name in names}, **values)
