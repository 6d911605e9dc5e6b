"""The GPT as the runner sees it: one forward per step over every prompt chunk and decode row,
on a KV cache the model holds, one slot per stream.

`GPTModel` is the protocol; `TorchGPT` its torch implementation: our `LlamaDecoder` over a
preallocated `SlotKVCache`, with the CUDA graphs of the decode step where they are captured (the
GPU path, and plain fp32 on a CPU where llama.cpp did not build). On a CPU llama.cpp fills the
same protocol (`engine/llamacpp_gpt.py`); `engine/gpt_build.py` builds whichever serves.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from torch import Tensor

from ..config import EngineConfig
from ..model.cuda_graphs import DecodeGraphs, length_buckets
from ..model.errors import ModelLoadError
from ..model.kv_cache import SlotKVCache
from ..model.llama import DecodeBatch, LlamaDecoder, PromptRun
from ..model.llama_layers import LlamaShape
from ..model.loader import ChatTTSModules
from ..timing.capture import AlignmentCapture, AttentionWeights
from ..timing.types import CaptureRequest, HeadId

log = logging.getLogger(__name__)


class GPTModel(Protocol):
    """What the runner needs of the GPT's 20 Llama layers."""

    shape: LlamaShape
    name: str
    """What runs them, for logs, metrics and `ModelInfo.backend` ('torch', 'llamacpp Q8_0')."""
    alignment_heads: tuple[HeadId, ...]
    """The heads whose attention times words (calibrated when it was built); (): none align,
    or attention cannot be read, and word timing is the estimate."""
    graphs_error: str
    """Why CUDA graphs asked for are not used ('' where none were asked for)."""

    def forward(
        self,
        prompts: list[PromptRun],
        decode: DecodeBatch | None,
        alignment: CaptureRequest | None = None,
    ) -> tuple[list[Tensor], Tensor | None, AttentionWeights | None]:
        """One step: each prompt chunk written into its slot's cache, with the hidden state
        (D,) of its last position, and the decode rows' (B, D). `alignment`: (heads, rows) whose
        attention weights to capture (None: nothing extra is computed); the capture, or None
        where it cannot be taken (a replayed graph)."""
        ...

    def free_slot(self, slot_id: int) -> None:
        """The slot's pass ended, or a new pass takes the slot: what it cached is dropped."""
        ...

    @property
    def decode_graphs(self) -> str:
        """'cuda', 'eager' or 'off', as `ModelInfo.decode_graphs` says."""
        ...


def decode_batch_sizes(max_batch: int) -> list[int]:
    """The decode batch sizes warm-up prepares for: powers of two up to `max_batch`, and it."""
    return sorted({max_batch} | {2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch})


class TorchGPT:
    """`LlamaDecoder` over the one preallocated `SlotKVCache` (slots x max tokens), the decode
    step replayed from CUDA graphs where they were captured."""

    def __init__(
        self, llama: LlamaDecoder, cache: SlotKVCache, graphs: DecodeGraphs | None
    ) -> None:
        self.llama = llama
        self.cache = cache
        self.graphs = graphs
        self.graphs_error = ""
        """Why the graphs asked for are not used: what their capture raised at warm-up."""
        self.shape = llama.shape
        self.name = "torch"
        self.alignment_heads: tuple[HeadId, ...] = ()

    @classmethod
    def build(
        cls,
        modules: ChatTTSModules,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        decode_graphs: str,
    ) -> TorchGPT:
        """`decode_graphs`: 'cuda' captures the decode step as CUDA graphs at warm-up; 'eager'
        runs the same padded static-shape path without graphs (CPU tests); 'off' decodes with
        dynamic shapes, fastest where no graph can be replayed."""
        llama = LlamaDecoder.from_state_dict(
            modules.gpt_config, modules.gpt_state_dict, device, dtype
        )
        _check_kv_fits(llama, config, device)
        num_slots = config.max_streams + (decode_graphs != "off")  # graphs pad into a scratch slot
        cache = SlotKVCache(llama.shape, num_slots, config.max_tokens, device, llama.kv_dtype)
        log.info(
            "KV cache: %d slots x %d tokens, %.1f MiB (%s)",
            config.max_streams,
            config.max_tokens,
            cache.nbytes / 2**20,
            llama.kv_dtype,
        )
        graphs = None
        if decode_graphs != "off":
            graphs = DecodeGraphs(
                lambda slots, embeds, positions, attend_len: llama.decode_static(
                    slots, embeds, positions, cache, attend_len
                ),
                decode_batch_sizes(config.max_streams),
                length_buckets(config.max_tokens),
                llama.shape.hidden_size,
                scratch_slot=config.max_streams,
                device=device,
                dtype=dtype,
                capture=decode_graphs == "cuda",
            )
        return cls(llama, cache, graphs)

    def forward(
        self,
        prompts: list[PromptRun],
        decode: DecodeBatch | None,
        alignment: CaptureRequest | None = None,
    ) -> tuple[list[Tensor], Tensor | None, AlignmentCapture | None]:
        """Every prompt chunk and the decode batch share the weight reads, so new prompts never
        queue behind each other or behind decoding; with CUDA graphs the decode batch replays
        its graph apart (and no attention is captured)."""
        if self.graphs is not None and decode is not None:
            prompt_hidden, _ = self.llama.forward_batch(prompts, None, self.cache)
            max_position = decode.max_position
            if max_position is None:
                max_position = int(decode.positions.max())
            hidden = self.graphs(decode.slot_ids, decode.embeds, decode.positions, max_position)
            return [h[-1] for h in prompt_hidden], hidden, None
        capture = None
        if alignment is not None:
            capture = AlignmentCapture(*alignment, self.cache, self.shape)
        prompt_hidden, decode_hidden = self.llama.forward_batch(
            prompts, decode, self.cache, capture=capture
        )
        return [h[-1] for h in prompt_hidden], decode_hidden, capture

    def free_slot(self, slot_id: int) -> None:
        """Positions are overwritten by the slot's next prompt: nothing to free."""

    def drop_graphs(self, exc: Exception) -> None:
        """A capture failed (driver, memory, an op that cannot be captured): serve with the
        eager decode rather than not at all, and say so (log, ModelInfo, health metadata)."""
        first_line = str(exc).strip().split("\n", 1)[0]
        self.graphs_error = f"{type(exc).__name__}: {first_line}"[:300]
        log.warning(
            "CUDA graph capture failed at warm-up (%s); the decode step runs eagerly",
            self.graphs_error,
            exc_info=True,
        )
        self.graphs = None  # frees the captured graphs, their pool and static buffers
        if self.cache.kv.device.type == "cuda":
            torch.cuda.synchronize(self.cache.kv.device)

    @property
    def decode_graphs(self) -> str:
        """'cuda', 'eager' or 'off', as `ModelInfo.decode_graphs` says."""
        return "off" if self.graphs is None else "cuda" if self.graphs.capture else "eager"


def _check_kv_fits(llama: LlamaDecoder, config: EngineConfig, device: torch.device) -> None:
    """On CUDA, size against the memory actually free after the weights are loaded: refuse a
    cache that cannot fit (with the slot count that would) rather than dying mid-serve."""
    if device.type != "cuda":
        return
    per_slot = SlotKVCache.bytes_per_slot(llama.shape, config.max_tokens, llama.kv_dtype)
    free_bytes, _ = torch.cuda.mem_get_info(device)
    # Leave a quarter of what is free for activations, the vocoder and the allocator.
    fits = int(0.75 * free_bytes) // per_slot
    log.info(
        "KV cache: %d slots requested, %d would fit in %.1f GiB free",
        config.max_streams,
        fits,
        free_bytes / 2**30,
    )
    if config.max_streams > fits:
        raise ModelLoadError(
            f"--max-streams {config.max_streams} x --max-tokens {config.max_tokens} needs "
            f"{config.max_streams * per_slot / 2**30:.1f} GiB of KV cache; "
            f"{free_bytes / 2**30:.1f} GiB is free, so at most {fits} slots fit"
        )
