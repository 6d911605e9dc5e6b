"""What a stream sends, as domain events, and their one conversion to protobuf (`to_pb`) and to
the JSON messages of the HTTP doors (`to_json`: the WebSocket's messages, the SSE events).

Every event sits on the stream's one timeline of samples (at the chunks' `sample_rate_hz`):
audio chunks are contiguous from 0, an utterance's end says where its audio lies, a mark where
the audio before it ends, a word timing where each word lies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias, overload

from chattts_proto.chattts.v1 import tts_pb2

from ..engine.events import UtteranceDone
from ..stream.segments import Outcome
from ..text.spans import Span
from ..timing.timeline import TimedWord, WordTimingsOut
from .convert import ENCODING_VALUES

TIMING_SOURCES = {"estimate": tts_pb2.TIMING_ESTIMATE, "attention": tts_pb2.TIMING_MODEL_ATTENTION}
"""`WordTimingsOut.source` -> tts.proto TimingSource."""


@dataclass(frozen=True)
class AudioOut:
    """Encoded audio of one utterance, at a position in the stream."""

    data: bytes
    sample_offset: int
    """Samples (at `sample_rate_hz`) the stream sent before this chunk."""
    num_samples: int
    utterance_index: int
    sample_rate_hz: int
    encoding: str
    silence: bool = False
    """Silence the stream asked for (`stream_items.Silence`), not speech: no first audio."""


@dataclass(frozen=True)
class UtteranceEnded:
    """An utterance is complete: all its audio has been sent."""

    utterance_index: int
    done: UtteranceDone
    audio_duration_s: float
    sample_offset: int = 0
    """Stream offset of its first sample."""
    num_samples: int = 0
    """Its samples that were sent (a cleared one: up to the cut)."""
    source_text: str = ""
    """The caller's own text of it, markup excluded."""
    source_span: Span | None = None
    """Where `source_text` lies in the caller's text, in code points; None: from no text."""
    lag_s: float = 0.0
    """From its first text reaching the server to its first audio being heard in real time."""
    speed: int = 0
    """The speed level it was spoken at."""


@dataclass(frozen=True)
class MarkReached:
    """The answer to a caller's mark: where the audio of the text before it ends."""

    name: str
    sample_offset: int
    offset_s: float
    dropped: bool = False
    """A clear dropped the text before it; the offset is the cut."""


@dataclass(frozen=True)
class SegmentEnded:
    """The one answer to a named segment's revision: how it ended, where its audio ends."""

    name: str
    revision: int
    outcome: Outcome
    sample_offset: int
    offset_s: float
    text: str
    """The caller's text of the revision."""


SessionEvent: TypeAlias = AudioOut | UtteranceEnded | MarkReached | WordTimingsOut | SegmentEnded


@overload
def to_pb(event: AudioOut) -> tts_pb2.AudioChunk: ...


@overload
def to_pb(event: UtteranceEnded) -> tts_pb2.UtteranceEnd: ...


@overload
def to_pb(event: MarkReached) -> tts_pb2.Mark: ...


@overload
def to_pb(event: WordTimingsOut) -> tts_pb2.WordTimings: ...


@overload
def to_pb(event: SegmentEnded) -> tts_pb2.SegmentEnd: ...


def to_pb(
    event: SessionEvent,
) -> (
    tts_pb2.AudioChunk
    | tts_pb2.UtteranceEnd
    | tts_pb2.Mark
    | tts_pb2.WordTimings
    | tts_pb2.SegmentEnd
):
    if isinstance(event, AudioOut):
        return tts_pb2.AudioChunk(
            audio=event.data,
            sample_offset=event.sample_offset,
            num_samples=event.num_samples,
            utterance_index=event.utterance_index,
            sample_rate_hz=event.sample_rate_hz,
            encoding=ENCODING_VALUES[event.encoding],
        )
    if isinstance(event, MarkReached):
        return tts_pb2.Mark(
            name=event.name,
            sample_offset=event.sample_offset,
            offset_s=event.offset_s,
            dropped=event.dropped,
        )
    if isinstance(event, SegmentEnded):
        return tts_pb2.SegmentEnd(
            name=event.name,
            revision=event.revision,
            outcome=event.outcome.value,
            sample_offset=event.sample_offset,
            offset_s=event.offset_s,
            text=event.text,
        )
    if isinstance(event, WordTimingsOut):
        return tts_pb2.WordTimings(
            utterance_index=event.utterance_index,
            words=[_word_pb(w) for w in event.words],
            source=TIMING_SOURCES[event.source],
        )
    done = event.done
    start, end = event.source_span or (0, 0)
    return tts_pb2.UtteranceEnd(
        utterance_index=event.utterance_index,
        text=done.text,
        audio_duration_s=event.audio_duration_s,
        time_to_first_audio_s=done.time_to_first_audio_s,
        generation_time_s=done.generation_time_s,
        num_tokens=done.num_tokens,
        finish_reason=done.finish_reason,
        sample_offset=event.sample_offset,
        num_samples=event.num_samples,
        source_text=event.source_text,
        source_start=start,
        source_end=end,
        lag_s=event.lag_s,
        speed=event.speed,
    )


def _word_pb(word: TimedWord) -> tts_pb2.WordTiming:
    start, end = word.source_span or (0, 0)
    return tts_pb2.WordTiming(
        text=word.text,
        start_sample=word.start_sample,
        end_sample=word.end_sample,
        start_s=word.start_s,
        end_s=word.end_s,
        source_start=start,
        source_end=end,
        source_text=word.source_text,
        has_source=word.source_span is not None,
    )


def to_json(
    event: UtteranceEnded | MarkReached | WordTimingsOut | SegmentEnded,
) -> dict[str, Any]:
    """The event as the WebSocket's JSON message (`type`: utterance_end, mark, word_timings,
    segment_end); the fields are tts.proto's names, offsets as numbers, an outcome as its
    lower-case name without the prefix ("spoken", "cut")."""
    if isinstance(event, SegmentEnded):
        return {
            "type": "segment_end",
            "name": event.name,
            "revision": event.revision,
            "outcome": event.outcome.label,
            "sample_offset": event.sample_offset,
            "offset_s": event.offset_s,
            "text": event.text,
        }
    if isinstance(event, MarkReached):
        return {
            "type": "mark",
            "name": event.name,
            "sample_offset": event.sample_offset,
            "offset_s": event.offset_s,
            "dropped": event.dropped,
        }
    if isinstance(event, WordTimingsOut):
        return {
            "type": "word_timings",
            "utterance_index": event.utterance_index,
            "source": event.source,
            "words": [_word_json(w) for w in event.words],
        }
    done = event.done
    start, end = event.source_span or (0, 0)
    return {
        "type": "utterance_end",
        "utterance_index": event.utterance_index,
        "text": done.text,
        "audio_duration_s": event.audio_duration_s,
        "time_to_first_audio_s": done.time_to_first_audio_s,
        "generation_time_s": done.generation_time_s,
        "num_tokens": done.num_tokens,
        "finish_reason": done.finish_reason,
        "sample_offset": event.sample_offset,
        "num_samples": event.num_samples,
        "source_text": event.source_text,
        "source_start": start,
        "source_end": end,
        "lag_s": event.lag_s,
        "speed": event.speed,
    }


def _word_json(word: TimedWord) -> dict[str, Any]:
    start, end = word.source_span or (0, 0)
    return {
        "text": word.text,
        "start_sample": word.start_sample,
        "end_sample": word.end_sample,
        "start_s": word.start_s,
        "end_s": word.end_s,
        "source_start": start,
        "source_end": end,
        "source_text": word.source_text,
        "has_source": word.source_span is not None,
    }
