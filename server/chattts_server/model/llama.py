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
from typing import cast

import torch
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from . import linear_modes
from .alignment_capture import AlignmentCapture
from .attention import (
    Attention,
    GatherAttention,
    PackedAttention,
    PrefillAttention,
    SlotRangeAttention,
    bf16_attention_faster,
)
from .compiled_decode import CompiledDecode
from .kv_cache import SlotKVCache
from .linear_modes import ModeTable
from .llama_layers import Layer, LlamaShape, q_kv, rms_norm

__all__ = ["DecodeBatch", "LlamaDecoder", "LlamaShape", "PromptRun", "served_kv_dtype"]

log = logging.getLogger(__name__)

# Rope types whose frequencies depend on the sequence length in ways a fixed table cannot hold.
# ("dynamic" only changes beyond max_position_embeddings, where our tables stop anyway.)
_UNSUPPORTED_ROPE_TYPES = {"longrope"}


def served_kv_dtype(
    shape: LlamaShape, device: torch.device, dtype: torch.dtype, lossy: bool
) -> torch.dtype:
    """The K/V dtype the server keeps: the model dtype, except that lossy linear modes on a CPU
    with fast bf16 keep K/V in bf16 where attention over it is faster (at 16 streams attention
    reads as many bytes of K/V per step as the int8 weights)."""
    bf16_kv = (
        lossy
        and linear_modes.MODES["bf16"].available(device, dtype)
        and bf16_attention_faster(shape.num_heads, shape.head_dim)
    )
    return torch.bfloat16 if bf16_kv else dtype


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


def _decode_attention(
    cache: SlotKVCache, slot_ids: Tensor, positions: Tensor, slot_list: list[int]
) -> Attention:
    """Slots close together are read in place (`SlotRangeAttention`); only a range more than
    twice the batch (slots far apart) gathers the rows' K/V (`GatherAttention`). `slot_list`:
    the slot ids as Python ints for the views (one host read per step)."""
    if max(slot_list) - min(slot_list) + 1 > 2 * len(slot_list):
        return GatherAttention(cache, slot_ids, positions, int(positions.max()) + 1)
    return SlotRangeAttention(cache, slot_ids, positions, slot_list)


class LlamaDecoder(nn.Module):
    """``LlamaModel`` without ``embed_tokens``, run over a :class:`SlotKVCache`.

    ``prefill`` fills one slot from embeddings (in one call or in chunks); ``decode`` advances a
    batch of slots by one token each, every row at its own position. Build it with
    :meth:`from_state_dict` on its final device and dtype; it is not meant to be moved after
    (oneDNN-packed weights do not move).
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
        self.quantize = "none"
        self.kv_dtype = norm.dtype
        """What the SlotKVCache should hold; attention runs in it (output back to fp32)."""
        self._modes = ModeTable({1: "dense"})
        self.prefill_mode: str | None = None
        """The mode prefill uses; None: the largest decode batch size's."""
        self.compiled: CompiledDecode | None = None
        """The torch.compile'd decode step and the batch sizes it serves (warm-up sets it,
        ``model/compiled_decode.py``); None: every decode step runs eagerly."""

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state_dict: Mapping[str, Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
        prefix: str = "",
        quantize: str = "none",
        modes: list[str] | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> LlamaDecoder:
        """Build from a ``LlamaModel`` state dict (keys ``layers.N...``, ``norm.weight``).

        ``prefix`` is stripped from keys, e.g. ``"gpt."`` for ChatTTS's GPT module; keys we do
        not use (``embed_tokens.weight``) are ignored. ``quantize`` ('none', 'bf16', 'int8',
        'auto') names the linear modes to build (``model/linear_modes.py``); ``modes`` lists
        them by name instead. Until :meth:`autotune` runs, every batch uses the first mode
        that ``quantize`` allows (oneDNN-packed weights on CPU where available).

        ``kv_dtype`` is the dtype the caller should give the :class:`SlotKVCache` (see
        :attr:`kv_dtype`); by default :func:`served_kv_dtype`'s.
        """
        device = torch.device(device)
        names = modes or linear_modes.modes_for(quantize, device, dtype)
        if "dense-onednn" in names:  # the default before autotune: 1.7x F.linear on some CPUs
            names = ["dense-onednn", *(n for n in names if n != "dense-onednn")]
        shape = LlamaShape.from_config(config)
        inv_freq, attention_scaling = _rope(config)
        sd = {
            k[len(prefix) :]: v.detach().to(device=device, dtype=dtype)
            for k, v in state_dict.items()
            if k.startswith(prefix) and not k.startswith(prefix + "embed_tokens.")
        }
        fuse_all = device.type != "cpu"
        layers = [
            Layer(sd, i, shape.rms_norm_eps, names, fuse_all) for i in range(shape.num_layers)
        ]
        model = cls(shape, layers, sd["norm.weight"], inv_freq, float(attention_scaling))
        model.quantize = quantize if modes is None else "explicit"
        if kv_dtype is None:
            kv_dtype = served_kv_dtype(shape, device, dtype, modes is None and quantize != "none")
        model.kv_dtype = kv_dtype
        model.set_mode_table({1: names[0]})
        if modes is None and quantize != "none":
            linear_modes.log_left_out(quantize, device, dtype)
        log.info(
            "GPT linear weights (%s): %s",
            quantize,
            ", ".join(f"{n} {model.weight_bytes(n) / 2**20:.0f} MiB" for n in names),
        )
        return model.eval()

    # -- linear modes ---------------------------------------------------------------------------

    @property
    def modes(self) -> list[str]:
        """The linear modes whose weights this decoder holds, in build order."""
        return list(cast("Layer", self.layers[0]).qkv.kernels.keys())

    @property
    def mode_table(self) -> dict[int, str]:
        """Decode batch size -> linear mode (``linear_modes.ModeTable``); prefill uses the
        largest size's mode unless :attr:`prefill_mode` is set (autotune times it apart)."""
        return dict(self._modes.table)

    def set_mode_table(self, table: Mapping[int, str]) -> None:
        unknown = set(table.values()) - set(self.modes)
        if unknown or not table:
            raise ValueError(f"modes {sorted(unknown)} not built (have {self.modes})")
        self._modes = ModeTable(table)

    def mode_for(self, num_rows: int) -> str:
        return self._modes.mode_for(num_rows)

    def weight_bytes(self, mode: str | None = None) -> int:
        """Bytes of linear weights held, for one mode or (None) all of them."""
        projections = [p for layer in self.layers for p in cast("Layer", layer).projections()]
        return sum(p.nbytes(mode) for p in projections)

    def keep_modes(self, keep: set[str]) -> None:
        """Free the weights of every mode not in ``keep`` (after autotune)."""
        if not keep or keep - set(self.modes):
            raise ValueError(f"cannot keep {sorted(keep)} of {self.modes}")
        for layer in self.layers:
            for proj in cast("Layer", layer).projections():
                proj.drop(keep)
        if self.prefill_mode not in keep:
            self.prefill_mode = None
        self.set_mode_table(
            {b: m for b, m in self._modes.table.items() if m in keep} or {1: next(iter(keep))}
        )

    # -- forward ------------------------------------------------------------------------------

    def _forward(
        self,
        x: Tensor,
        positions: Tensor,
        attention: Attention,
        mode: str,
        capture: AlignmentCapture | None = None,
    ) -> Tensor:
        """The layer body every forward shares: x (rows, D) at `positions` (rows,) -> final-normed
        hidden states (rows, D); `attention` writes each layer's K/V and attends. `capture`
        (alignment heads only; None: nothing extra) records chosen heads' weights."""
        cos = self.rope_cos[positions][:, None]  # (rows, 1, hd)
        sin = self.rope_sin[positions][:, None]
        for i, layer in enumerate(cast("list[Layer]", self.layers)):
            q, kv = q_kv(self.shape, layer, x, cos, sin, mode)
            attn = attention(i, q, kv)
            if capture is not None:
                capture(i, q)
            # The o kernel takes attention's output in its own dtype (bf16 K/V into a bf16
            # kernel: no round trip); the adds promote bf16 kernel outputs to x's dtype.
            x = x + layer.o(attn, mode)[0]
            x = x + layer.mlp(x, mode)
        return rms_norm(x, self.norm, self.shape.rms_norm_eps)

    def prefill(
        self,
        slot_id: int,
        embeds: Tensor,
        start_pos: int,
        cache: SlotKVCache,
        mode: str | None = None,
    ) -> Tensor:
        """Run ``embeds`` (L, D) at positions ``start_pos..start_pos+L-1`` of slot ``slot_id``.

        Writes that range of the slot's K/V and attends causally to it and to the slot's
        earlier positions, so a long prompt may come in chunks. Returns final-normed hidden
        states (L, D). ``mode`` forces a linear mode (default: :attr:`prefill_mode`).
        """
        mode = mode or self._prefill_mode
        num_tokens = embeds.shape[0]
        positions = torch.arange(start_pos, start_pos + num_tokens, device=embeds.device)
        attention = PrefillAttention(cache, slot_id, start_pos, num_tokens)
        return self._forward(embeds, positions, attention, mode)

    @property
    def _prefill_mode(self) -> str:
        return self.prefill_mode or self._modes.largest

    def decode(
        self,
        slot_ids: Tensor,
        embeds: Tensor,
        positions: Tensor,
        cache: SlotKVCache,
        mode: str | None = None,
        capture: AlignmentCapture | None = None,
    ) -> Tensor:
        """One token for each row: ``embeds`` (B, D) at ``positions`` (B,) of ``slot_ids`` (B,).

        Slot ids must be distinct. Writes K/V at (slot, position) and attends to positions
        0..position of the row's slot. Returns final-normed hidden states (B, D). The linear
        mode is the :attr:`mode_table`'s for B unless ``mode`` forces one. Slots close together
        are read in place (`SlotRangeAttention`); only a range more than twice the batch (slots
        far apart) gathers the rows' K/V (`GatherAttention`). Batch sizes warm-up chose the
        compiled step for (:attr:`compiled`) run it instead, unless ``capture`` (see
        `_forward`) asks for attention weights, which only the eager step computes.
        """
        mode = mode or self.mode_for(len(embeds))
        if (
            capture is None
            and self.compiled is not None
            and self.compiled.covers(len(embeds), mode)
        ):
            return self.compiled.run(slot_ids, embeds, positions, cache, mode)
        attention = _decode_attention(cache, slot_ids, positions, slot_ids.tolist())
        return self._forward(embeds, positions, attention, mode, capture)

    def forward_batch(
        self,
        prompts: Sequence[PromptRun],
        decode: DecodeBatch | None,
        cache: SlotKVCache,
        mode: str | None = None,
        capture: AlignmentCapture | None = None,
    ) -> tuple[list[Tensor], Tensor | None]:
        """One forward for a whole engine step: every prompt chunk (as :meth:`prefill` would
        run each) and the decode batch (as :meth:`decode`), their rows stacked so the weights
        are read once. Each part attends to its own slot only. Returns the prompts' hidden
        states (L_i, D) in order and the decode rows' (B, D) (None without a decode batch).

        The linear mode is the :attr:`mode_table`'s for the total row count while that is
        within the table, else prefill's (a big batch is compute-bound, like a long prompt).
        A decode batch alone runs as :meth:`decode` (compiled where warm-up chose it).
        ``capture`` (see `_forward`) names rows of the decode batch.
        """
        if not prompts and decode is not None:
            hidden = self.decode(
                decode.slot_ids, decode.embeds, decode.positions, cache, mode, capture
            )
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
            attention = _decode_attention(
                cache, decode.slot_ids, decode.positions, decode.slot_ids.tolist()
            )
            parts.append((len(decode.embeds), attention))
            embeds.append(decode.embeds)
            positions.append(decode.positions)
        if not parts:
            return [], None
        rows = sum(n for n, _ in parts)
        if mode is None:
            in_table = rows <= max(self._modes.table)
            mode = self.mode_for(rows) if in_table or not prompts else self._prefill_mode
        attention = parts[0][1] if len(parts) == 1 else PackedAttention(parts)
        if capture is not None:
            capture.row_offset = rows - (len(decode.embeds) if decode is not None else 0)
        hidden = self._forward(torch.cat(embeds), torch.cat(positions), attention, mode, capture)
        pieces = list(hidden.split([n for n, _ in parts]))
        return (pieces[:-1], pieces[-1]) if decode is not None else (pieces, None)

    def decode_static(
        self,
        slot_ids: Tensor,
        embeds: Tensor,
        positions: Tensor,
        cache: SlotKVCache,
        attend_len: int,
        mode: str | None = None,
    ) -> Tensor:
        """`decode` with fixed shapes and no host reads, for CUDA graph capture
        (`model/cuda_graphs.py`): each row's K/V is gathered over the first `attend_len`
        positions of its slot (masked past the row's own position), whatever the slot layout.
        Rows may share a slot only as padding (their writes are then garbage in that slot)."""
        attention = GatherAttention(cache, slot_ids, positions, attend_len)
        return self._forward(embeds, positions, attention, mode or self.mode_for(len(embeds)))
