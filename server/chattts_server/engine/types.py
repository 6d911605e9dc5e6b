"""Domain types shared by the transport and the engine. Plain Python and numpy, no torch."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class EngineError(Exception):
    """A request failed inside the engine; the message is safe to show to the client."""


class InvalidRequestError(EngineError):
    """The engine refused a request as invalid (e.g. a malformed speaker embedding)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name
        self.description = message


class EngineUnavailableError(EngineError):
    """The engine is not ready, draining, or broken."""


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 0.3
    """Softmax temperature of the audio-code head (ChatTTS default 0.3)."""
    top_p: float = 0.7
    """Nucleus mass (ChatTTS default 0.7)."""
    top_k: int = 20
    """Keep the k most likely codes; 1 is greedy (ChatTTS default 20)."""
    repetition_penalty: float = 1.05
    """Penalty on codes repeated in the last 16 tokens (ChatTTS default 1.05)."""
    seed: int | None = None
    """Per-request random seed; None draws from the engine's generator."""
    max_new_tokens: int = 768
    """Audio tokens per utterance at most."""
    min_new_tokens: int = 0
    """EOS is masked until this many tokens are generated."""


@dataclass(frozen=True)
class RefineOptions:
    enabled: bool = False
    """Run ChatTTS's refine-text pass (text head) before generating audio codes."""
    oral: int = 2
    laugh: int = 0
    break_level: int = 6

    def prompt(self) -> str:
        return f"[oral_{self.oral}][laugh_{self.laugh}][break_{self.break_level}]"


class VoiceKind(enum.Enum):
    DEFAULT = "default"
    SEED = "seed"
    EMBEDDING = "embedding"
    REFERENCE = "reference"


@dataclass(frozen=True)
class VoiceSpec:
    """A resolved voice: presets are turned into a seed or an embedding by the transport."""

    kind: VoiceKind = VoiceKind.DEFAULT
    seed: int = 0
    embedding: str = ""
    reference_pcm: bytes = field(default=b"", repr=False)
    """REFERENCE: the clip as float32 mono PCM at the model's rate."""
    reference_id: str = ""
    """REFERENCE: a digest of the clip, so it is encoded once and reused."""
    transcript: str = ""
    """REFERENCE: what is said in the clip."""


@dataclass(frozen=True)
class ChunkingOptions:
    """Per-request overrides of the streaming decoder's schedule; None keeps the server's."""

    first_chunk_tokens: int | None = None
    max_chunk_tokens: int | None = None
    lookahead_tokens: int | None = None


@dataclass(frozen=True)
class UtteranceRequest:
    """One utterance (sentence) to synthesize: the unit the engine schedules."""

    request_id: str
    text: str
    voice: VoiceSpec = field(default_factory=VoiceSpec)
    speed: int = 5
    """ChatTTS [speed_N] level, 0..9."""
    refine: RefineOptions = field(default_factory=RefineOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)
    deadline: float | None = None
    """time.monotonic() after which the request is abandoned."""


@dataclass
class AudioChunk:
    pcm: np.ndarray
    """(num_samples,) float32 mono at the model's sample rate."""


@dataclass
class UtteranceDone:
    text: str
    """Text actually spoken (after refinement)."""
    num_tokens: int
    num_samples: int
    time_to_first_audio_s: float
    generation_time_s: float
    finish_reason: str
    """'eos' or 'max_tokens'."""


EngineEvent = AudioChunk | UtteranceDone


@dataclass(frozen=True)
class EngineStats:
    active_requests: int
    waiting_requests: int
    num_slots: int
    tokens_generated: int


class Engine(Protocol):
    """What the transport sees of the engine. Implementations run tensor code on their own thread."""

    sample_rate: int
    speaker_dim: int

    @property
    def ready(self) -> bool: ...

    @property
    def healthy(self) -> bool: ...

    def synthesize(self, request: UtteranceRequest) -> AsyncIterator[EngineEvent]:
        """Stream the audio of one utterance; closing the iterator cancels the request."""
        ...

    def stats(self) -> EngineStats: ...
