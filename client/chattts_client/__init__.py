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
    AudioChunkEvent,
    Clear,
    Event,
    Flush,
    StreamItem,
    UtteranceEndEvent,
    VoiceInfo,
    event_from_pb,
    make_config,
    parse_encoding,
    parse_voice,
)
from chattts_client.options import ClientOptions, PathOrBytes, SynthesisOptions
from chattts_client.push_stream import PushStream
from chattts_client.wav import WavWriter, pcm16_to_float, streaming_wav_header

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_TARGET",
    "AsyncEventStream",
    "AsyncTTSClient",
    "AudioChunkEvent",
    "Clear",
    "ClientOptions",
    "Event",
    "EventStream",
    "Flush",
    "PathOrBytes",
    "PushStream",
    "StreamItem",
    "SynthesisOptions",
    "SynthesisStats",
    "TTSClient",
    "UtteranceEndEvent",
    "VoiceInfo",
    "WavWriter",
    "event_from_pb",
    "make_config",
    "parse_encoding",
    "parse_voice",
    "pcm16_to_float",
    "streaming_wav_header",
]
