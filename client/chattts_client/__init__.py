"""chattts-stream client: generated stubs, client library and CLI."""

from chattts_client.client import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TARGET,
    AsyncEventStream,
    AsyncTTSClient,
    EventStream,
    SynthesisStats,
    TTSClient,
)
from chattts_client.messages import (
    MODEL_SAMPLE_RATE_HZ,
    AudioChunkEvent,
    Clear,
    Event,
    Flush,
    Mark,
    MarkEvent,
    StreamItem,
    UtteranceEndEvent,
    VoiceInfo,
    WordTiming,
    WordTimingsEvent,
    event_from_pb,
    make_config,
    parse_encoding,
    parse_voice,
)
from chattts_client.options import ClientOptions, PathOrBytes, SynthesisOptions
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
    "PathOrBytes",
    "PushStream",
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
    "make_config",
    "parse_encoding",
    "parse_voice",
    "pcm16_to_float",
    "streaming_wav_header",
    "to_srt",
    "to_webvtt",
    "write_subtitles",
]
