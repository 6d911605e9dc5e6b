"""Our forward pass for ChatTTS's GPT (a transformers ``LlamaModel`` fed with ``inputs_embeds``).

It reads the same weights and config as ``LlamaModel`` but keeps K/V in one preallocated
:class:`SlotKVCache`, so that a decode step can run many requests together, each in its own slot
and at its own position (continuous batching). Numerics follow transformers: RMSNorm in fp32,
rotary tables computed in fp32 then cast, attention through ``scaled_dot_product_attention``.
Every forward (prefill, decode, the fixed-shape decode of CUDA graphs) runs the same layer
body; they differ only in how queries meet the cache (``model/attention.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .attention import (
    Attention,
    GatherAttention,
    PackedAttention,
    PrefillAttention,
)
from .kv_cache import SlotKVCache
from .llama_layers import Layer, LlamaShape, q_kv, rms_norm

__all__ = ["DecodeBatch", "LlamaDecoder", "LlamaShape", "PromptRun"]

log = logging.getLogger(__name__)

# Rope types whose frequencies depend on the sequence length in ways a fixed table cannot hold.
# ("dynamic" only changes beyond max_position_embeddings, where our tables stop anyway.)
_UNSUPPORTED_ROPE_TYPES = {"longrope"}


class LayerCapture(Protocol):
    """Reads each layer's roped queries as the forward runs (`timing/capture.AlignmentCapture`:
    the alignment heads' attention)."""

    row_offset: int
    """Rows of the forward before the decode batch's first row (set by `forward_batch`)."""

    def __call__(self, layer_id: int, q: Tensor) -> None: ...


@dataclass(frozen=True)
class PromptRun:
    """Prompt positions [start_pos, start_pos + L) of one slot, in a batched forward."""

    slot_id: int
    embeds: Tensor
    """(L, D) input embeddings."""
    start_pos: int


@dataclass(frozen=True)
class DecodeBatch:
    """One token for each of B distinct slots, each at its own position."""

    slot_ids: Tensor
    """(B,) slot ids."""
    embeds: Tensor
    """(B, D) input embeddings."""
    positions: Tensor
    """(B,) KV positions of the inputs."""
    max_position: int | None = None
    """The largest of `positions` where the host knows it (CUDA graphs pick their attention
    length by it without reading the device)."""


def _rope(config: LlamaConfig) -> tuple[Tensor, float]:
    """(inv_freq, attention scaling) of the config's rotary embedding, as transformers'."""
    rope_scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type in _UNSUPPORTED_ROPE_TYPES:
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq, float(scaling)


def _decode_attention(cache: SlotKVCache, slot_ids: Tensor, positions: Tensor) -> Attention:
    """Each row's K/V gathered from its slot up to the batch's last position."""
    return GatherAttention(cache, slot_ids, positions, int(positions.max()) + 1)


class LlamaDecoder(nn.Module):
    """``LlamaModel`` without ``embed_tokens``, run over a :class:`SlotKVCache`.

    ``prefill`` fills one slot from embeddings (in one call or in chunks); ``decode`` advances a
    batch of slots by one token each, every row at its own position. Build it with
    :meth:`from_state_dict` on its final device and dtype.
    """

    norm: Tensor
    rope_cos: Tensor  # (max_positions, head_dim)
    rope_sin: Tensor  # sin with its first half negated (see _apply_rope)

    def __init__(
        self,
        shape: LlamaShape,
        layers: list[Layer],
        norm: Tensor,
        inv_freq: Tensor,
        attention_scaling: float,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.layers = nn.ModuleList(layers)
        self.register_buffer("norm", norm)
        # Rotary tables for every position, computed as LlamaRotaryEmbedding does (in fp32,
        # then cast to the weights' dtype as transformers casts cos/sin).
        positions = torch.arange(shape.max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.float().cpu()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * attention_scaling, emb.sin() * attention_scaling
        sin[:, : sin.shape[1] // 2] *= -1
        self.register_buffer("rope_cos", cos.to(device=norm.device, dtype=norm.dtype))
        self.register_buffer("rope_sin", sin.to(device=norm.device, dtype=norm.dtype))
        self.kv_dtype = norm.dtype
        """What the SlotKVCache should hold: the weights' dtype."""

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state_dict: Mapping[str, Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
        prefix: str = "",
    ) -> LlamaDecoder:
        """Build from a ``LlamaModel`` state dict (keys ``layers.N...``, ``norm.weight``).

        ``prefix`` is stripped from keys, e.g. ``"gpt."`` for ChatTTS's GPT module; keys we do
        not use (``embed_tokens.weight``) are ignored. Weights already on ``device`` in
        ``dtype`` are shared, not copied (but for the stacked Q/K/V and gate/up).
        """
        device = torch.device(device)
        shape = LlamaShape.from_config(config)
        inv_freq, attention_scaling = _rope(config)
        sd = {
            k[len(prefix) :]: v.detach().to(device=device, dtype=dtype)
            for k, v in state_dict.items()
            if k.startswith(prefix) and not k.startswith(prefix + "embed_tokens.")
        }
        layers = [Layer(sd, i, shape.rms_norm_eps) for i in range(shape.num_layers)]
        model = cls(shape, layers, sd["norm.weight"], inv_freq, float(attention_scaling))
        return model.eval()

    # -- forward ------------------------------------------------------------------------------

    def _forward(
        self,
        x: Tensor,
        positions: Tensor,
        attention: Attention,
        capture: LayerCapture | None = None,
    ) -> Tensor:
        """The layer body every forward shares: x (rows, D) at `positions` (rows,) -> final-normed
        hidden states (rows, D); `attention` writes each layer's K/V and attends. `capture`
        (alignment heads only; None: nothing extra) records chosen heads' weights."""
        cos = self.rope_cos[positions][:, None]  # (rows, 1, hd)
        sin = self.rope_sin[positions][:, None]
        for i, layer in enumerate(cast("list[Layer]", self.layers)):
            q, kv = q_kv(self.shape, layer, x, cos, sin)
            attn = attention(i, q, kv)
            if capture is not None:
                capture(i, q)
            x = x + layer.o(attn)[0]
            x = x + layer.mlp(x)
        return rms_norm(x, self.norm, self.shape.rms_norm_eps)

    def prefill(
        self,
        slot_id: int,
        embeds: Tensor,
        start_pos: int,
        cache: SlotKVCache,
    ) -> Tensor:
        """Run ``embeds`` (L, D) at positions ``start_pos..start_pos+L-1`` of slot ``slot_id``.

        Writes that range of the slot's K/V and attends causally to it and to the slot's
        earlier positions, so a long prompt may come in chunks. Returns final-normed hidden
        states (L, D).
        """
        num_tokens = embeds.shape[0]
        positions = torch.arange(start_pos, start_pos + num_tokens, device=embeds.device)
        attention = PrefillAttention(cache, slot_id, start_pos, num_tokens)
        return self._forward(embeds, positions, attention)

    def decode(
        self,
        slot_ids: Tensor,
        embeds: Tensor,
        positions: Tensor,
        cache: SlotKVCache,
        capture: LayerCapture | None = None,
    ) -> Tensor:
        """One token for each row: ``embeds`` (B, D) at ``positions`` (B,) of ``slot_ids`` (B,).

        Slot ids must be distinct. Writes K/V at (slot, position) and attends to positions
        0..position of the row's slot. Returns final-normed hidden states (B, D).
        """
        attention = _decode_attention(cache, slot_ids, positions)
        return self._forward(embeds, positions, attention, capture)

    def forward_batch(
        self,
        prompts: Sequence[PromptRun],
        decode: DecodeBatch | None,
        cache: SlotKVCache,
        capture: LayerCapture | None = None,
    ) -> tuple[list[Tensor], Tensor | None]:
        """One forward for a whole engine step: every prompt chunk (as :meth:`prefill` would
        run each) and the decode batch (as :meth:`decode`), their rows stacked so the weights
        are read once. Each part attends to its own slot only. Returns the prompts' hidden
        states (L_i, D) in order and the decode rows' (B, D) (None without a decode batch).
        ``capture`` (see `_forward`) names rows of the decode batch.
        """
        if not prompts and decode is not None:
            hidden = self.decode(decode.slot_ids, decode.embeds, decode.positions, cache, capture)
            return [], hidden
        parts: list[tuple[int, Attention]] = []
        embeds: list[Tensor] = []
        positions: list[Tensor] = []
        for run in prompts:
            num_tokens = run.embeds.shape[0]
            parts.append(
                (num_tokens, PrefillAttention(cache, run.slot_id, run.start_pos, num_tokens))
            )
            embeds.append(run.embeds)
            positions.append(
                torch.arange(run.start_pos, run.start_pos + num_tokens, device=run.embeds.device)
            )
        if decode is not None:
            attention = _decode_attention(cache, decode.slot_ids, decode.positions)
            parts.append((len(decode.embeds), attention))
            embeds.append(decode.embeds)
            positions.append(decode.positions)
        if not parts:
            return [], None
        rows = sum(n for n, _ in parts)
        attention = parts[0][1] if len(parts) == 1 else PackedAttention(parts)
        if capture is not None:
            capture.row_offset = rows - (len(decode.embeds) if decode is not None else 0)
        hidden = self._forward(torch.cat(embeds), torch.cat(positions), attention, capture)
        pieces = list(hidden.split([n for n, _ in parts]))
        return (pieces[:-1], pieces[-1]) if decode is not None else (pieces, None)

    def decode_static(
        self,
        slot_ids: Tensor,
        embeds: Tensor,
        positions: Tensor,
        cache: SlotKVCache,
        attend_len: int,
    ) -> Tensor:
        """`decode` with fixed shapes and no host reads, for CUDA graph capture
        (`model/cuda_graphs.py`): each row's K/V is gathered over the first `attend_len`
        positions of its slot (masked past the row's own position), whatever the slot layout.
        Rows may share a slot only as padding (their writes are then garbage in that slot)."""
        attention = GatherAttention(cache, slot_ids, positions, attend_len)
        return self._forward(embeds, positions, attention)
