"""A stream's events (stream/events.py) on the wire: their one conversion to protobuf (`to_pb`,
and `reply` for the field of a response's oneof) and to the JSON messages of the HTTP doors
(`to_json`: the WebSocket's messages, the SSE events)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from chattts_proto.chattts.v1 import tts_pb2

from ..stream.events import AudioOut, MarkReached, SegmentEnded, SessionEvent, UtteranceEnded
from ..timing.timeline import TimedWord, WordTimingsOut
from .convert import ENCODING_VALUES

_R = TypeVar("_R", bound=Message)
TIMING_SOURCES = {"estimate": tts_pb2.TIMING_ESTIMATE, "attention": tts_pb2.TIMING_MODEL_ATTENTION}
"""`WordTimingsOut.source` -> tts.proto TimingSource."""


def _audio_pb(event: AudioOut) -> tts_pb2.AudioChunk:
    return tts_pb2.AudioChunk(
        audio=event.data,
        sample_offset=event.sample_offset,
        num_samples=event.num_samples,
        utterance_index=event.utterance_index,
        sample_rate_hz=event.sample_rate_hz,
        encoding=ENCODING_VALUES[event.encoding],
        heard_source_end=event.heard_source_end,
    )


def _mark_pb(event: MarkReached) -> tts_pb2.Mark:
    return tts_pb2.Mark(
        name=event.name,
        sample_offset=event.sample_offset,
        offset_s=event.offset_s,
        dropped=event.dropped,
    )


def _segment_end_pb(event: SegmentEnded) -> tts_pb2.SegmentEnd:
    return tts_pb2.SegmentEnd(
        name=event.name,
        revision=event.revision,
        outcome=event.outcome.value,
        sample_offset=event.sample_offset,
        offset_s=event.offset_s,
        text=event.text,
    )


def _word_timings_pb(event: WordTimingsOut) -> tts_pb2.WordTimings:
    return tts_pb2.WordTimings(
        utterance_index=event.utterance_index,
        words=[_word_pb(w) for w in event.words],
        source=TIMING_SOURCES[event.source],
    )


def _utterance_end_pb(event: UtteranceEnded) -> tts_pb2.UtteranceEnd:
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


_PB: dict[type, tuple[str, Callable[[Any], Message]]] = {
    AudioOut: ("audio", _audio_pb),
    UtteranceEnded: ("utterance_end", _utterance_end_pb),
    MarkReached: ("mark", _mark_pb),
    WordTimingsOut: ("word_timings", _word_timings_pb),
    SegmentEnded: ("segment_end", _segment_end_pb),
}
"""Each event type: its field in the responses' oneof, and its message."""


def to_pb(event: SessionEvent) -> Message:
    return _PB[type(event)][1](event)


def reply(response: Callable[..., _R], event: SessionEvent) -> _R:
    """The event in its field of a response's oneof (both responses use the same names)."""
    field_name, convert = _PB[type(event)]
    return response(**{field_name: convert(event)})


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
