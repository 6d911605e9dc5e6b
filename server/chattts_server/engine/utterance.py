"""What the engine is asked for: one utterance (`UtteranceRequest`) and its settings (voice,
sampling, refine, chunking, priority). Plain Python, no torch.

The defaults here are the request's: a front door that leaves a field unset takes them from
these types (`api/convert.py` reads `RefineOptions()`, `DEFAULT_SPEED`, `SamplingParams()`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from ..defaults import CHUNK_TOKEN_BOUNDS, check_chunk_sizes
from ..text.spans import Traced


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
        if first is not None and cap is not None:
            name = "first_chunk_tokens" if self.first_chunk_tokens else "max_chunk_tokens"
            check_chunk_sizes(first, cap, name)


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
    expires_at: float | None = None
    """time.monotonic() past which, if its prefill has not begun, the request is dropped with
    ExpiredError (its segment's TextInput.expires_in_ms); None: never."""
    priority: Priority = Priority.DEFAULT
    """Its stream's class: the scheduler seats and prefills more urgent requests first."""
    source: Traced | None = None
    """`text` traced to the caller's text (a stream's utterance, stream/items.Speak), so
    the spoken words keep their spans; None: `text` is its own source."""
    word_timing: bool = False
    """Its stream asked for word timing: with alignment heads, its decode steps read their
    attention (a step with no such row reads none)."""
