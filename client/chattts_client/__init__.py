"""chattts-stream client: generated stubs, client library and CLI."""

from chattts_client.calls import AsyncEventStream, EventStream, SynthesisStats
from chattts_client.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TARGET,
    ClientOptions,
    PathOrBytes,
)
from chattts_client.client import AsyncTTSClient, TTSClient
from chattts_client.config import (
    SynthesisOptions,
    lexicon_value,
    make_config,
    parse_encoding,
    parse_voice,
)
from chattts_client.messages import (
    MODEL_SAMPLE_RATE_HZ,
    AudioChunkEvent,
    Clear,
    Event,
    Flush,
    Mark,
    MarkEvent,
    Replace,
    ResumedEvent,
    Segment,
    SegmentEndEvent,
    StreamItem,
    UtteranceEndEvent,
    VoiceInfo,
    WordTiming,
    WordTimingsEvent,
    event_from_pb,
)
from chattts_client.push_stream import PushStream
from chattts_client.subtitles import Cue, cues, to_srt, to_webvtt, write_subtitles
from chattts_client.timeline import Timeline
from chattts_client.wav import WavWriter, pcm16_to_float, streaming_wav_header

__all__ = [
    "AsyncEventStream",
    "AsyncTTSClient",
    "AudioChunkEvent",
    "Clear",
    "ClientOptions",
    "Cue",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_TARGET",
    "Event",
    "EventStream",
    "Flush",
    "MODEL_SAMPLE_RATE_HZ",
    "Mark",
    "MarkEvent",
    "ResumedEvent",
    "PathOrBytes",
    "PushStream",
    "Replace",
    "Segment",
    "SegmentEndEvent",
    "StreamItem",
    "SynthesisOptions",
    "SynthesisStats",
    "TTSClient",
    "Timeline",
    "UtteranceEndEvent",
    "VoiceInfo",
    "WavWriter",
    "WordTiming",
    "WordTimingsEvent",
    "cues",
    "event_from_pb",
    "lexicon_value",
    "make_config",
    "parse_encoding",
    "parse_voice",
    "pcm16_to_float",
    "streaming_wav_header",
    "to_srt",
    "to_webvtt",
    "write_subtitles",
]
