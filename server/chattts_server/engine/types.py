"""Domain types shared by the transport and the engine. Plain Python and numpy, no torch.

The defaults here are the request's: a front door that leaves a field unset takes them from
these types (`api/convert.py` reads `RefineOptions()`, `DEFAULT_SPEED`, `SamplingParams()`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import CHUNK_TOKEN_BOUNDS, FIRST_CHUNK_TOKENS, LOOKAHEAD_TOKENS, MAX_CHUNK_TOKENS
from ..text.attention_timing import TokenAlignment
from ..text.spans import Traced


class EngineError(Exception):
    """A request failed inside the engine; the message is safe to show to the client."""


class InvalidRequestError(ValueError):
    """A request is invalid: a field the front door validates (`config.sampling.top_p`) or one
    the engine refuses (a malformed speaker embedding). `field_name` is its path in the request
    as the client spelled it; every door answers it as INVALID_ARGUMENT / 400 naming it."""

    def __init__(self, field_name: str, description: str) -> None:
        super().__init__(f"{field_name}: {description}")
        self.field_name = field_name
        self.description = description


RequestFailure = EngineError | InvalidRequestError
"""What one request alone can fail with inside the engine (the step's other requests go on)."""


class EngineUnavailableError(EngineError):
    """The engine is not ready, draining, or broken."""


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings; defaults are ChatTTS's ``InferCodeParams``.

    The API layer checks ranges before a request gets here; the engine does not re-check.
    """

    temperature: float | tuple[float, ...] = 0.3
    """Softmax temperature of the head (> 0): one value, or one per codebook."""
    top_p: float = 0.7
    """Nucleus mass in (0, 1]; 1 disables."""
    top_k: int = 20
    """Keep the k most likely tokens; 0 disables, 1 is greedy, 2 acts as 3 (ChatTTS keeps 3)."""
    repetition_penalty: float = 1.05
    """Penalty on tokens repeated in the last 16 of each codebook; 1 disables."""
    seed: int | None = None
    """Per-request random seed; None draws from the engine's shared generator."""
    max_new_tokens: int | None = None
    """Tokens per pass at most; None is the server's --max-new-tokens. Clamped to the room a
    KV slot has left after the prompt."""
    min_new_tokens: int = 0
    """The end token is masked until this many tokens are generated (audio: at least 1)."""


REFINE_SAMPLING = SamplingParams(
    temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.0, max_new_tokens=384
)
"""The refine-text pass's sampling: ChatTTS's RefineTextParams defaults (the request's seed
is kept)."""


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
    """Overrides of the streaming decoder's chunk schedule, from the server's flags or one
    request; None keeps the level below (request -> server flags -> the decoder's defaults)."""

    first_chunk_tokens: int | None = None
    """New tokens in the first audio chunk."""
    max_chunk_tokens: int | None = None
    """Cap on new tokens per audio chunk."""
    lookahead_tokens: int | None = None
    """Tokens past a chunk that must exist before it is decoded."""

    def check(self, below: ChunkingOptions) -> None:
        """ValueError naming the first field that is wrong: a set field out of
        `config.CHUNK_TOKEN_BOUNDS`, or a first chunk longer than the cap once the unset one of
        the two is taken from `below` (the server's schedule)."""
        for f in dataclasses.fields(self):
            value, (low, high) = getattr(self, f.name), CHUNK_TOKEN_BOUNDS[f.name]
            if value is not None and not low <= value <= high:
                raise ValueError(f"{f.name} must be in [{low}, {high}], got {value}")
        first = self.first_chunk_tokens or below.first_chunk_tokens
        cap = self.max_chunk_tokens or below.max_chunk_tokens
        if first is not None and cap is not None and first > cap:
            name = "first_chunk_tokens" if self.first_chunk_tokens else "max_chunk_tokens"
            raise ValueError(
                f"{name} must leave first_chunk_tokens ({first}) <= max_chunk_tokens ({cap})"
            )


DEFAULT_CHUNKING = ChunkingOptions(FIRST_CHUNK_TOKENS, MAX_CHUNK_TOKENS, LOOKAHEAD_TOKENS)
"""The schedule of a server started with the default flags."""

DEFAULT_SPEED = 5
"""ChatTTS's `[speed_N]` level when a request sets none (the middle of 0..9)."""


class Priority(enum.IntEnum):
    """A stream's scheduling class (tts.proto `Priority`). Lower values go first: admission
    orders waiting streams by it, then arrival; only INTERACTIVE may take a reserved slot
    (`--reserved-slots`); the engine's prefill budget goes to the lowest value first."""

    INTERACTIVE = 0
    """Latency-bound prompts: navigation, a voice agent's turn."""
    DEFAULT = 1
    BULK = 2
    """Backlogs that can wait: captions of a recording, batch jobs."""

    @property
    def label(self) -> str:
        """The name in metrics, logs and the HTTP `chattts.priority` shorthand."""
        return self.name.lower()


@dataclass(frozen=True)
class UtteranceRequest:
    """One utterance (sentence) to synthesize: the unit the engine schedules."""

    request_id: str
    text: str
    voice: VoiceSpec = field(default_factory=VoiceSpec)
    speed: int = DEFAULT_SPEED
    """ChatTTS [speed_N] level, 0..9."""
    refine: RefineOptions = field(default_factory=RefineOptions)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chunking: ChunkingOptions = field(default_factory=ChunkingOptions)
    deadline: float | None = None
    """time.monotonic() after which the request is abandoned."""
    priority: Priority = Priority.DEFAULT
    """Its stream's class: the scheduler seats and prefills more urgent requests first."""
    source: Traced | None = None
    """`text` traced to the caller's text (a stream's utterance, api/stream_items.Speak), so
    the spoken words keep their spans; None: `text` is its own source."""


@dataclass(frozen=True)
class Spoken:
    """Sent before an utterance's first audio: the text its audio speaks (normalized, refined
    if the refine pass ran), each character traced to the caller's text (`source`). A door
    that is cut off mid-utterance (barge-in) still knows what was being said."""

    text: Traced


@dataclass
class AudioChunk:
    pcm: np.ndarray
    """(num_samples,) float32 mono at the model's sample rate."""


@dataclass(frozen=True)
class UtteranceDone:
    """The last event of an utterance, with its figures (all measured on the engine thread)."""

    text: str
    """Text actually spoken (after normalization and refinement)."""
    num_tokens: int
    """Audio tokens generated (GPT steps; about 46.9 per second of audio)."""
    num_samples: int
    """PCM samples emitted at the model's rate."""
    time_to_first_audio_s: float
    """Submission to the first audio chunk produced (the whole time if there was none)."""
    generation_time_s: float
    """Submission to the last audio chunk produced."""
    finish_reason: str
    """'eos' (the model ended the sentence) or 'max_tokens' (the token cap cut it)."""
    spoken: Traced | None = None
    """`text` traced to the caller's text, as in `Spoken`."""
    alignment: TokenAlignment | None = None
    """With alignment heads: the text token each audio token attends to (word timing)."""


EngineEvent = Spoken | AudioChunk | UtteranceDone


@dataclass(frozen=True)
class ModelInfo:
    """What the loaded model is, published once it is ready; validation is built from it."""

    sample_rate: int
    """Hz of the PCM the vocoder produces."""
    samples_per_token: int
    """PCM samples one GPT step decodes to (2 mel frames x the vocoder's hop)."""
    speaker_dim: int
    """Values in a speaker embedding (the GPT's hidden size)."""
    num_vq: int
    """Audio codebooks per GPT step."""
    num_audio_codes: int
    """Codes per codebook, the end code included."""
    max_new_tokens: int
    """Ceiling (and default) of audio tokens per utterance."""
    max_tokens: int
    """KV positions per slot: prompt plus generated tokens."""
    device: str
    """Where the model runs, e.g. 'cpu' or 'cuda:0'."""
    dtype: str
    """The GPT's weight dtype, e.g. 'float32'."""
    linear_modes: dict[int, str] = field(default_factory=dict)
    """Decode batch size -> the GPT linear mode it uses (chosen by timing at warm-up)."""
    decode_graphs: str = "off"
    """How the decode step runs: 'cuda' (replaying CUDA graphs captured at warm-up), 'eager'
    (the graphs' padded static-shape path without capture) or 'off' (plain eager decode)."""
    decode_graphs_error: str = ""
    """Why CUDA graphs that were asked for are not in use: the capture error at warm-up."""
    timing_source: str = "estimate"
    """Where word timing comes from: 'attention' (alignment heads chosen at warm-up) or
    'estimate' (none qualified; text/timing.py)."""
    chunking: ChunkingOptions = DEFAULT_CHUNKING
    """The server's chunk schedule (its flags, every field set); a request's `chunking`
    overrides it field by field and is checked against it (`ChunkingOptions.check`)."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after each step (safe to read from any thread)."""

    active_requests: int
    """Utterances holding a KV slot."""
    waiting_requests: int
    """Utterances queued for a slot."""
    num_slots: int
    """KV slots allocated."""
    tokens_generated: int
    """Audio and text tokens sampled since start."""


class Engine(Protocol):
    """What the transport sees of the engine. Implementations run tensor code on their own thread."""

    @property
    def ready(self) -> bool: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def model_info(self) -> ModelInfo:
        """Valid once `ready` is true."""
        ...

    def synthesize(self, request: UtteranceRequest) -> AsyncIterator[EngineEvent]:
        """Stream the audio of one utterance; closing the iterator cancels the request."""
        ...

    def stats(self) -> EngineStats: ...
