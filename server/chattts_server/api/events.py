"""What a stream sends, as domain events, and their one conversion to protobuf (`to_pb`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias, overload

from chattts_proto.chattts.v1 import tts_pb2

from ..engine.types import UtteranceDone
from .convert import ENCODING_VALUES


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


@dataclass(frozen=True)
class UtteranceEnded:
    """An utterance is complete: all its audio has been sent."""

    utterance_index: int
    done: UtteranceDone
    audio_duration_s: float


SessionEvent: TypeAlias = AudioOut | UtteranceEnded


@overload
def to_pb(event: AudioOut) -> tts_pb2.AudioChunk: ...


@overload
def to_pb(event: UtteranceEnded) -> tts_pb2.UtteranceEnd: ...


def to_pb(event: SessionEvent) -> tts_pb2.AudioChunk | tts_pb2.UtteranceEnd:
    if isinstance(event, AudioOut):
        return tts_pb2.AudioChunk(
            audio=event.data,
            sample_offset=event.sample_offset,
            num_samples=event.num_samples,
            utterance_index=event.utterance_index,
            sample_rate_hz=event.sample_rate_hz,
            encoding=ENCODING_VALUES[event.encoding],
        )
    done = event.done
    return tts_pb2.UtteranceEnd(
        utterance_index=event.utterance_index,
        text=done.text,
        audio_duration_s=event.audio_duration_s,
        time_to_first_audio_s=done.time_to_first_audio_s,
        generation_time_s=done.generation_time_s,
        num_tokens=done.num_tokens,
        finish_reason=done.finish_reason,
    )
