"""A stream's validated settings: what every utterance of it is synthesized with (built from a
request by `api/convert.Validator`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.utterance import (
    DEFAULT_SPEED,
    ChunkingOptions,
    Priority,
    RefineOptions,
    SamplingParams,
    VoiceSpec,
)
from ..text.lexicon import Lexicons
from ..text.lexicon_library import LexiconLibrary
from ..text.release import ReleasePolicy
from .catch_up import LagLimits


@dataclass(frozen=True)
class AudioOptions:
    encoding: str
    """An encoding this server writes: a key of ENCODING_VALUES, or one of the HTTP
    containers (audio/containers.py: WAV, MP3, AAC, FLAC)."""
    sample_rate_hz: int
    """Output rate (the model's own when the client gives none: `Validator` works it out)."""


@dataclass(frozen=True)
class StreamSettings:
    """A validated SynthesisConfig: what every utterance of a stream is synthesized with."""

    audio: AudioOptions
    voice: VoiceSpec = field(default_factory=VoiceSpec)
    speed: int = DEFAULT_SPEED
    refine: RefineOptions = field(default_factory=RefineOptions)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)
    text_release: ReleasePolicy = field(default_factory=ReleasePolicy)
    """When streamed text is released, and the longest utterance (by estimated duration)."""
    ssml: bool = False
    """Read the text as an SSML document (text/ssml); `markdown` is then False."""
    ssml_ignore_unknown: bool = False
    """SSML: read an element outside the table as its text instead of refusing it."""
    markdown: bool = True
    """Read the text as markdown (markup not spoken); False reads every character as text."""
    word_timing: bool = False
    """Send each utterance's word timings (WordTimings) before its end."""
    priority: Priority = Priority.DEFAULT
    """The stream's class: admission order, reserved slots, the engine's prefill order."""
    lexicons: Lexicons | None = None
    """The pronunciation lexicons every utterance is read through: the server's, then the
    stream's own (api/lexicons.py); None when there are none."""
    server_lexicons: LexiconLibrary = field(default_factory=LexiconLibrary)
    """The server's lexicons by name, for an SSML document's `<lexicon uri>`."""
    lag_limits: LagLimits | None = None
    """Captions that keep up (max_lag_s): when to speed up and skip; None: no limit."""
    pace_lead_s: float | None = None
    """Send audio at most this far ahead of a real-time listener; None: as fast as made."""
