from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AudioEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIO_ENCODING_UNSPECIFIED: _ClassVar[AudioEncoding]
    LINEAR16: _ClassVar[AudioEncoding]
    MULAW: _ClassVar[AudioEncoding]
    ALAW: _ClassVar[AudioEncoding]
    OGG_OPUS: _ClassVar[AudioEncoding]
    FLOAT32: _ClassVar[AudioEncoding]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_INTERACTIVE: _ClassVar[Priority]
    PRIORITY_DEFAULT: _ClassVar[Priority]
    PRIORITY_BULK: _ClassVar[Priority]

class TextFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEXT_FORMAT_UNSPECIFIED: _ClassVar[TextFormat]
    MARKDOWN: _ClassVar[TextFormat]
    PLAIN: _ClassVar[TextFormat]
    SSML: _ClassVar[TextFormat]

class IfStarted(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IF_STARTED_UNSPECIFIED: _ClassVar[IfStarted]
    FINISH: _ClassVar[IfStarted]
    CUT: _ClassVar[IfStarted]
    DROP_NEW: _ClassVar[IfStarted]

class SegmentOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEGMENT_OUTCOME_UNSPECIFIED: _ClassVar[SegmentOutcome]
    SEGMENT_SPOKEN: _ClassVar[SegmentOutcome]
    SEGMENT_REPLACED: _ClassVar[SegmentOutcome]
    SEGMENT_CUT: _ClassVar[SegmentOutcome]
    SEGMENT_EXPIRED: _ClassVar[SegmentOutcome]
    SEGMENT_NOT_SPOKEN: _ClassVar[SegmentOutcome]

class TimingSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIMING_SOURCE_UNSPECIFIED: _ClassVar[TimingSource]
    TIMING_ESTIMATE: _ClassVar[TimingSource]
    TIMING_MODEL_ATTENTION: _ClassVar[TimingSource]
AUDIO_ENCODING_UNSPECIFIED: AudioEncoding
LINEAR16: AudioEncoding
MULAW: AudioEncoding
ALAW: AudioEncoding
OGG_OPUS: AudioEncoding
FLOAT32: AudioEncoding
PRIORITY_UNSPECIFIED: Priority
PRIORITY_INTERACTIVE: Priority
PRIORITY_DEFAULT: Priority
PRIORITY_BULK: Priority
TEXT_FORMAT_UNSPECIFIED: TextFormat
MARKDOWN: TextFormat
PLAIN: TextFormat
SSML: TextFormat
IF_STARTED_UNSPECIFIED: IfStarted
FINISH: IfStarted
CUT: IfStarted
DROP_NEW: IfStarted
SEGMENT_OUTCOME_UNSPECIFIED: SegmentOutcome
SEGMENT_SPOKEN: SegmentOutcome
SEGMENT_REPLACED: SegmentOutcome
SEGMENT_CUT: SegmentOutcome
SEGMENT_EXPIRED: SegmentOutcome
SEGMENT_NOT_SPOKEN: SegmentOutcome
TIMING_SOURCE_UNSPECIFIED: TimingSource
TIMING_ESTIMATE: TimingSource
TIMING_MODEL_ATTENTION: TimingSource

class Voice(_message.Message):
    __slots__ = ("seed", "speaker_embedding", "preset", "reference")
    SEED_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    seed: int
    speaker_embedding: str
    preset: str
    reference: ReferenceVoice
    def __init__(self, seed: _Optional[int] = ..., speaker_embedding: _Optional[str] = ..., preset: _Optional[str] = ..., reference: _Optional[_Union[ReferenceVoice, _Mapping]] = ...) -> None: ...

class ReferenceVoice(_message.Message):
    __slots__ = ("audio", "transcript")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    transcript: str
    def __init__(self, audio: _Optional[bytes] = ..., transcript: _Optional[str] = ...) -> None: ...

class AudioFormat(_message.Message):
    __slots__ = ("encoding", "sample_rate_hz")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    encoding: AudioEncoding
    sample_rate_hz: int
    def __init__(self, encoding: _Optional[_Union[AudioEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ...) -> None: ...

class Prosody(_message.Message):
    __slots__ = ("speed", "refine_text", "oral", "laugh", "break_level")
    SPEED_FIELD_NUMBER: _ClassVar[int]
    REFINE_TEXT_FIELD_NUMBER: _ClassVar[int]
    ORAL_FIELD_NUMBER: _ClassVar[int]
    LAUGH_FIELD_NUMBER: _ClassVar[int]
    BREAK_LEVEL_FIELD_NUMBER: _ClassVar[int]
    speed: float
    refine_text: bool
    oral: int
    laugh: int
    break_level: int
    def __init__(self, speed: _Optional[float] = ..., refine_text: bool = ..., oral: _Optional[int] = ..., laugh: _Optional[int] = ..., break_level: _Optional[int] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_new_tokens", "min_new_tokens")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int
    max_new_tokens: int
    min_new_tokens: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ...) -> None: ...

class TextReleasePolicy(_message.Message):
    __slots__ = ("clause_min_words", "max_words", "idle_ms", "first_words")
    CLAUSE_MIN_WORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORDS_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_WORDS_FIELD_NUMBER: _ClassVar[int]
    clause_min_words: int
    max_words: int
    idle_ms: int
    first_words: int
    def __init__(self, clause_min_words: _Optional[int] = ..., max_words: _Optional[int] = ..., idle_ms: _Optional[int] = ..., first_words: _Optional[int] = ...) -> None: ...

class Chunking(_message.Message):
    __slots__ = ("first_chunk_tokens", "max_chunk_tokens", "lookahead_tokens")
    FIRST_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    first_chunk_tokens: int
    max_chunk_tokens: int
    lookahead_tokens: int
    def __init__(self, first_chunk_tokens: _Optional[int] = ..., max_chunk_tokens: _Optional[int] = ..., lookahead_tokens: _Optional[int] = ...) -> None: ...

class SynthesisConfig(_message.Message):
    __slots__ = ("voice", "audio_format", "prosody", "sampling", "text_release", "text_format", "chunking", "word_timing", "priority", "ssml_ignore_unknown_elements", "lexicons", "max_lag_s", "hard_lag_s", "catch_up_max_speed", "pace_lead_s", "resumable", "read_receipts")
    VOICE_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROSODY_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TEXT_RELEASE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SSML_IGNORE_UNKNOWN_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    LEXICONS_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_S_FIELD_NUMBER: _ClassVar[int]
    HARD_LAG_S_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_MAX_SPEED_FIELD_NUMBER: _ClassVar[int]
    PACE_LEAD_S_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    READ_RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    voice: Voice
    audio_format: AudioFormat
    prosody: Prosody
    sampling: Sampling
    text_release: TextReleasePolicy
    text_format: TextFormat
    chunking: Chunking
    word_timing: bool
    priority: Priority
    ssml_ignore_unknown_elements: bool
    lexicons: _containers.RepeatedScalarFieldContainer[str]
    max_lag_s: float
    hard_lag_s: float
    catch_up_max_speed: int
    pace_lead_s: float
    resumable: bool
    read_receipts: bool
    def __init__(self, voice: _Optional[_Union[Voice, _Mapping]] = ..., audio_format: _Optional[_Union[AudioFormat, _Mapping]] = ..., prosody: _Optional[_Union[Prosody, _Mapping]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., text_release: _Optional[_Union[TextReleasePolicy, _Mapping]] = ..., text_format: _Optional[_Union[TextFormat, str]] = ..., chunking: _Optional[_Union[Chunking, _Mapping]] = ..., word_timing: bool = ..., priority: _Optional[_Union[Priority, str]] = ..., ssml_ignore_unknown_elements: bool = ..., lexicons: _Optional[_Iterable[str]] = ..., max_lag_s: _Optional[float] = ..., hard_lag_s: _Optional[float] = ..., catch_up_max_speed: _Optional[int] = ..., pace_lead_s: _Optional[float] = ..., resumable: bool = ..., read_receipts: bool = ...) -> None: ...

class TextInput(_message.Message):
    __slots__ = ("text", "flush", "clear", "mark", "segment", "replace", "if_started", "expires_in_ms", "seq", "last")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    IF_STARTED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    text: str
    flush: bool
    clear: bool
    mark: str
    segment: str
    replace: str
    if_started: IfStarted
    expires_in_ms: int
    seq: int
    last: bool
    def __init__(self, text: _Optional[str] = ..., flush: bool = ..., clear: bool = ..., mark: _Optional[str] = ..., segment: _Optional[str] = ..., replace: _Optional[str] = ..., if_started: _Optional[_Union[IfStarted, str]] = ..., expires_in_ms: _Optional[int] = ..., seq: _Optional[int] = ..., last: bool = ...) -> None: ...

class SegmentEnd(_message.Message):
    __slots__ = ("name", "revision", "outcome", "sample_offset", "offset_s", "text")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    outcome: SegmentOutcome
    sample_offset: int
    offset_s: float
    text: str
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ..., outcome: _Optional[_Union[SegmentOutcome, str]] = ..., sample_offset: _Optional[int] = ..., offset_s: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class StreamingSynthesizeRequest(_message.Message):
    __slots__ = ("config", "text", "resume", "cancel", "receipt")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    config: SynthesisConfig
    text: TextInput
    resume: ResumeStream
    cancel: CancelStream
    receipt: ReadReceipt
    def __init__(self, config: _Optional[_Union[SynthesisConfig, _Mapping]] = ..., text: _Optional[_Union[TextInput, _Mapping]] = ..., resume: _Optional[_Union[ResumeStream, _Mapping]] = ..., cancel: _Optional[_Union[CancelStream, _Mapping]] = ..., receipt: _Optional[_Union[ReadReceipt, _Mapping]] = ...) -> None: ...

class ReadReceipt(_message.Message):
    __slots__ = ("sample_offset",)
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    sample_offset: int
    def __init__(self, sample_offset: _Optional[int] = ...) -> None: ...

class ResumeStream(_message.Message):
    __slots__ = ("stream_id", "resume_token", "sample_offset", "events_received")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    resume_token: str
    sample_offset: int
    events_received: int
    def __init__(self, stream_id: _Optional[str] = ..., resume_token: _Optional[str] = ..., sample_offset: _Optional[int] = ..., events_received: _Optional[int] = ...) -> None: ...

class CancelStream(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("audio", "sample_offset", "num_samples", "utterance_index", "sample_rate_hz", "encoding", "heard_source_end")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    HEARD_SOURCE_END_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    sample_offset: int
    num_samples: int
    utterance_index: int
    sample_rate_hz: int
    encoding: AudioEncoding
    heard_source_end: int
    def __init__(self, audio: _Optional[bytes] = ..., sample_offset: _Optional[int] = ..., num_samples: _Optional[int] = ..., utterance_index: _Optional[int] = ..., sample_rate_hz: _Optional[int] = ..., encoding: _Optional[_Union[AudioEncoding, str]] = ..., heard_source_end: _Optional[int] = ...) -> None: ...

class UtteranceEnd(_message.Message):
    __slots__ = ("utterance_index", "text", "audio_duration_s", "time_to_first_audio_s", "generation_time_s", "num_tokens", "finish_reason", "sample_offset", "num_samples", "source_text", "source_start", "source_end", "lag_s", "speed")
    UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_AUDIO_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TIME_S_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_START_FIELD_NUMBER: _ClassVar[int]
    SOURCE_END_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    utterance_index: int
    text: str
    audio_duration_s: float
    time_to_first_audio_s: float
    generation_time_s: float
    num_tokens: int
    finish_reason: str
    sample_offset: int
    num_samples: int
    source_text: str
    source_start: int
    source_end: int
    lag_s: float
    speed: int
    def __init__(self, utterance_index: _Optional[int] = ..., text: _Optional[str] = ..., audio_duration_s: _Optional[float] = ..., time_to_first_audio_s: _Optional[float] = ..., generation_time_s: _Optional[float] = ..., num_tokens: _Optional[int] = ..., finish_reason: _Optional[str] = ..., sample_offset: _Optional[int] = ..., num_samples: _Optional[int] = ..., source_text: _Optional[str] = ..., source_start: _Optional[int] = ..., source_end: _Optional[int] = ..., lag_s: _Optional[float] = ..., speed: _Optional[int] = ...) -> None: ...

class Mark(_message.Message):
    __slots__ = ("name", "sample_offset", "offset_s", "dropped")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    name: str
    sample_offset: int
    offset_s: float
    dropped: bool
    def __init__(self, name: _Optional[str] = ..., sample_offset: _Optional[int] = ..., offset_s: _Optional[float] = ..., dropped: bool = ...) -> None: ...

class WordTiming(_message.Message):
    __slots__ = ("text", "start_sample", "end_sample", "start_s", "end_s", "source_start", "source_end", "source_text", "has_source")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    START_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    END_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    SOURCE_START_FIELD_NUMBER: _ClassVar[int]
    SOURCE_END_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TEXT_FIELD_NUMBER: _ClassVar[int]
    HAS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    text: str
    start_sample: int
    end_sample: int
    start_s: float
    end_s: float
    source_start: int
    source_end: int
    source_text: str
    has_source: bool
    def __init__(self, text: _Optional[str] = ..., start_sample: _Optional[int] = ..., end_sample: _Optional[int] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., source_start: _Optional[int] = ..., source_end: _Optional[int] = ..., source_text: _Optional[str] = ..., has_source: bool = ...) -> None: ...

class WordTimings(_message.Message):
    __slots__ = ("utterance_index", "words", "source")
    UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    utterance_index: int
    words: _containers.RepeatedCompositeFieldContainer[WordTiming]
    source: TimingSource
    def __init__(self, utterance_index: _Optional[int] = ..., words: _Optional[_Iterable[_Union[WordTiming, _Mapping]]] = ..., source: _Optional[_Union[TimingSource, str]] = ...) -> None: ...

class StreamingSynthesizeResponse(_message.Message):
    __slots__ = ("audio", "utterance_end", "mark", "word_timings", "segment_end")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_END_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_END_FIELD_NUMBER: _ClassVar[int]
    audio: AudioChunk
    utterance_end: UtteranceEnd
    mark: Mark
    word_timings: WordTimings
    segment_end: SegmentEnd
    def __init__(self, audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., utterance_end: _Optional[_Union[UtteranceEnd, _Mapping]] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ..., word_timings: _Optional[_Union[WordTimings, _Mapping]] = ..., segment_end: _Optional[_Union[SegmentEnd, _Mapping]] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "config")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    text: str
    config: SynthesisConfig
    def __init__(self, text: _Optional[str] = ..., config: _Optional[_Union[SynthesisConfig, _Mapping]] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("audio", "utterance_end", "mark", "word_timings")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_END_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    audio: AudioChunk
    utterance_end: UtteranceEnd
    mark: Mark
    word_timings: WordTimings
    def __init__(self, audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., utterance_end: _Optional[_Union[UtteranceEnd, _Mapping]] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ..., word_timings: _Optional[_Union[WordTimings, _Mapping]] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VoiceInfo(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices",)
    VOICES_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[VoiceInfo]
    def __init__(self, voices: _Optional[_Iterable[_Union[VoiceInfo, _Mapping]]] = ...) -> None: ...
