"""The engine as the transport sees it: the `Engine` protocol, what the loaded model is
(`ModelInfo`) and the load it carries (`EngineStats`). No torch: the gRPC and HTTP layers import
this, never the runner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from .events import EngineEvent
from .utterance import ChunkingOptions, UtteranceRequest


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
    chunking: ChunkingOptions
    """The server's chunk schedule (its flags, every field set); a request's `chunking`
    overrides it field by field and is checked against it (`ChunkingOptions.check`)."""
    backend: str = "torch"
    """What runs the GPT's layers: 'llamacpp <format>' on a CPU (`engine/gpt_build.py`),
    'torch' on CUDA or where llama.cpp did not build."""
    decode_graphs: str = "off"
    """How the decode step runs: 'cuda' (replaying CUDA graphs captured at warm-up), 'eager'
    (the graphs' padded static-shape path without capture) or 'off' (plain eager decode)."""
    decode_graphs_error: str = ""
    """Why CUDA graphs that were asked for are not in use: the capture error at warm-up."""
    timing_source: str = "estimate"
    """Where word timing comes from: 'attention' (alignment heads chosen at warm-up) or
    'estimate' (none qualified; timing/estimate.py)."""


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
