"""Our forward pass for ChatTTS's GPT (a transformers ``LlamaModel`` fed with ``inputs_embeds``).

It reads the same weights and config as ``LlamaModel`` but keeps K/V in one preallocated
:class:`SlotKVCache`, so that a decode step can run many requests together, each in its own slot
and at its own position (continuous batching). Numerics follow transformers: RMSNorm in fp32,
rotary tables computed in fp32 then cast, attention through ``scaled_dot_product_attention``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Rope types whose frequencies depend on the sequence length in ways a fixed table cannot hold.
# ("dynamic" only changes beyond max_position_embeddings, where our tables stop anyway.)
_UNSUPPORTED_ROPE_TYPES = {"longrope"}


@dataclass(frozen=True)
class LlamaShape:
    """The sizes our forward needs, read once from a ``LlamaConfig``."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_positions: int

    @classmethod
    def from_config(cls, config: LlamaConfig) -> LlamaShape:
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            max_positions=config.max_position_embeddings,
        )


class SlotKVCache:
    """K/V for ``num_slots`` sequences of up to ``max_tokens`` positions, allocated once.

    One tensor ``kv`` of shape (layers, 2, slots, kv_heads, max_tokens, head_dim); index 0 of the
    second axis is K, 1 is V. A slot is reused by the next request without clearing: attention
    only ever reads positions a request has written. It starts zeroed so that never-written
    positions are finite (a masked NaN would still poison the softmax). Its device and dtype
    must be the decoder's.
    """

    def __init__(
        self,
        shape: LlamaShape,
        num_slots: int,
        max_tokens: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        if max_tokens > shape.max_positions:
            raise ValueError(
                f"max_tokens {max_tokens} exceeds max_position_embeddings {shape.max_positions}"
            )
        self.kv = torch.zeros(
            (shape.num_layers, 2, num_slots, shape.num_kv_heads, max_tokens, shape.head_dim),
            device=device,
            dtype=dtype,
        )

    @staticmethod
    def bytes_per_slot(shape: LlamaShape, max_tokens: int, dtype: torch.dtype) -> int:
        """Bytes one slot takes, to size ``num_slots`` from the memory left after warm-up."""
        elem = torch.empty((), dtype=dtype).element_size()
        return shape.num_layers * 2 * shape.num_kv_heads * max_tokens * shape.head_dim * elem

    @property
    def num_slots(self) -> int:
        return self.kv.shape[2]

    @property
    def max_tokens(self) -> int:
        return self.kv.shape[4]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # As LlamaRMSNorm: statistics in fp32, scale in the weights' dtype.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: (rows, heads, head_dim); cos, sin: (rows, 1, head_dim)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN linear ops :class:`LlamaDecoder` can use on CPU."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


# Batch size oneDNN packs the weights for; measured to matter little between 1 and 64.
_ONEDNN_BATCH_HINT = 16


class _Projection(nn.Module):
    """``x @ W.T + b`` for one or more weights that read the same input (Q/K/V, gate/up).

    ``fuse`` stacks the weights into one matmul and splits the output. ``onednn`` keeps the
    weight in oneDNN's packed layout and runs ``torch.ops.mkldnn._linear_pointwise`` (the op
    torch's inductor uses for CPU linears): on a 2-core AMD EPYC it ran the decode step's
    matmuls 2x (batch 1) to 3x (batch 2-8) faster than ``F.linear``'s MKL path; see
    bench/bench_decode_step.py.
    """

    weight0: Tensor  # then weight1, ... when not fused; oneDNN-packed when onednn
    bias0: Tensor | None

    def __init__(
        self, weights: list[Tensor], biases: list[Tensor | None], fuse: bool, onednn: bool
    ) -> None:
        super().__init__()
        self.sizes = [w.shape[0] for w in weights]
        self.onednn = onednn
        has_bias = all(b is not None for b in biases)
        if fuse and len(weights) > 1:
            weights = [torch.cat(weights, dim=0)]
            biases = [torch.cat(cast("list[Tensor]", biases), dim=0) if has_bias else None]
        self.num_matmuls = len(weights)
        for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
            if onednn:
                w = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), _ONEDNN_BATCH_HINT)
            self.register_buffer(f"weight{i}", w)
            self.register_buffer(f"bias{i}", b if has_bias else None)

    def _linear(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return F.linear(x, weight, bias)

    def forward(self, x: Tensor) -> list[Tensor]:
        if self.num_matmuls == 1:
            y = self._linear(x, self.weight0, self.bias0)
            return [y] if len(self.sizes) == 1 else list(y.split(self.sizes, dim=-1))
        return [
            self._linear(x, getattr(self, f"weight{i}"), getattr(self, f"bias{i}"))
            for i in range(self.num_matmuls)
        ]


class _Layer(nn.Module):
    """One decoder layer's weights."""

    input_norm: Tensor
    post_norm: Tensor

    def __init__(
        self, sd: Mapping[str, Tensor], prefix: str, eps: float, fuse: bool, onednn: bool
    ) -> None:
        super().__init__()
        self.eps = eps

        def proj(names: list[str]) -> _Projection:
            weights = [sd[f"{prefix}{n}.weight"] for n in names]
            biases = [sd.get(f"{prefix}{n}.bias") for n in names]
            return _Projection(weights, biases, fuse, onednn)

        self.register_buffer("input_norm", sd[prefix + "input_layernorm.weight"])
        self.register_buffer("post_norm", sd[prefix + "post_attention_layernorm.weight"])
        self.qkv = proj([f"self_attn.{p}_proj" for p in "qkv"])
        self.o = proj(["self_attn.o_proj"])
        self.gate_up = proj(["mlp.gate_proj", "mlp.up_proj"])
        self.down = proj(["mlp.down_proj"])

    def mlp(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(_rms_norm(x, self.post_norm, self.eps))
        return self.down(F.silu(gate) * up)[0]


class LlamaDecoder(nn.Module):
    """``LlamaModel`` without ``embed_tokens``, run over a :class:`SlotKVCache`.

    ``prefill`` fills one slot from embeddings (in one call or in chunks); ``decode`` advances a
    batch of slots by one token each, every row at its own position. Build it with
    :meth:`from_state_dict` on its final device and dtype; it is not meant to be moved after
    (oneDNN-packed weights do not move).
    """

    norm: Tensor
    rope_cos: Tensor  # (max_positions, head_dim)
    rope_sin: Tensor

    def __init__(
        self,
        shape: LlamaShape,
        layers: list[_Layer],
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
        self.register_buffer("rope_cos", cos.to(device=norm.device, dtype=norm.dtype))
        self.register_buffer("rope_sin", sin.to(device=norm.device, dtype=norm.dtype))
        self._gqa = shape.num_kv_heads != shape.num_heads

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state_dict: Mapping[str, Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
        prefix: str = "",
        matmul: Literal["auto", "torch", "onednn"] = "auto",
        fuse_projections: bool | None = None,
    ) -> LlamaDecoder:
        """Build from a ``LlamaModel`` state dict (keys ``layers.N...``, ``norm.weight``).

        ``prefix`` is stripped from keys, e.g. ``"gpt."`` for ChatTTS's GPT module; keys we do
        not use (``embed_tokens.weight``) are ignored. ``matmul``: "onednn" runs the linears
        on oneDNN-packed weights (CPU, fp32), "torch" through ``F.linear``; "auto" takes
        oneDNN on CPU in fp32 where available. ``fuse_projections`` stacks Q/K/V and gate/up
        into single matmuls; by default everywhere except ``F.linear`` on CPU, where MKL ran
        the stacked matrices ~10% slower.
        """
        device = torch.device(device)
        if matmul == "auto":
            use_onednn = device.type == "cpu" and dtype == torch.float32 and onednn_available()
        else:
            use_onednn = matmul == "onednn"
        if fuse_projections is None:
            fuse_projections = use_onednn or device.type != "cpu"
        shape = LlamaShape.from_config(config)
        rope_scaling = getattr(config, "rope_scaling", None) or {}
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        if rope_type in _UNSUPPORTED_ROPE_TYPES:
            raise NotImplementedError(f"rope_type {rope_type!r} is not supported")
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        sd = {
            k[len(prefix) :]: v.detach().to(device=device, dtype=dtype)
            for k, v in state_dict.items()
            if k.startswith(prefix) and not k.startswith(prefix + "embed_tokens.")
        }
        layers = [
            _Layer(sd, f"layers.{i}.", shape.rms_norm_eps, fuse_projections, use_onednn)
            for i in range(shape.num_layers)
        ]
        model = cls(shape, layers, sd["norm.weight"], inv_freq, float(attention_scaling))
        return model.eval()

    def _qkv(self, layer: _Layer, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        # x: (rows, hidden) -> q (rows, heads, hd), k and v (rows, kv_heads, hd); q, k roped.
        s = self.shape
        q, k, v = layer.qkv(_rms_norm(x, layer.input_norm, s.rms_norm_eps))
        q = _apply_rope(q.view(x.shape[0], s.num_heads, s.head_dim), cos, sin)
        k = _apply_rope(k.view(x.shape[0], s.num_kv_heads, s.head_dim), cos, sin)
        return q, k, v.view(x.shape[0], s.num_kv_heads, s.head_dim)

    def prefill(self, slot_id: int, embeds: Tensor, start_pos: int, cache: SlotKVCache) -> Tensor:
        """Run ``embeds`` (L, D) at positions ``start_pos..start_pos+L-1`` of slot ``slot_id``.

        Writes that range of the slot's K/V and attends causally to it and to the slot's
        earlier positions, so a long prompt may come in chunks. Returns final-normed hidden
        states (L, D).
        """
        num_tokens = embeds.shape[0]
        end_pos = start_pos + num_tokens
        cos = self.rope_cos[start_pos:end_pos, None]
        sin = self.rope_sin[start_pos:end_pos, None]
        if start_pos == 0:
            mask, causal = None, True
        else:
            # Query i sits at start_pos + i and sees keys 0..start_pos + i.
            q_pos = torch.arange(start_pos, end_pos, device=embeds.device)
            k_pos = torch.arange(end_pos, device=embeds.device)
            mask, causal = k_pos[None, :] <= q_pos[:, None], False
        x = embeds
        for i, layer in enumerate(cast("list[_Layer]", self.layers)):
            q, k, v = self._qkv(layer, x, cos, sin)
            k_cache, v_cache = cache.kv[i, 0, slot_id], cache.kv[i, 1, slot_id]
            k_cache[:, start_pos:end_pos] = k.transpose(0, 1)
            v_cache[:, start_pos:end_pos] = v.transpose(0, 1)
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                k_cache[None, :, :end_pos],
                v_cache[None, :, :end_pos],
                attn_mask=mask,
                is_causal=causal,
                enable_gqa=self._gqa,
            )  # (1, heads, L, hd)
            attn = attn[0].transpose(0, 1).reshape(num_tokens, -1)
            x = x + layer.o(attn)[0]
            x = x + layer.mlp(x)
        return _rms_norm(x, self.norm, self.shape.rms_norm_eps)

    def decode(
        self, slot_ids: Tensor, embeds: Tensor, positions: Tensor, cache: SlotKVCache
    ) -> Tensor:
        """One token for each row: ``embeds`` (B, D) at ``positions`` (B,) of ``slot_ids`` (B,).

        Slot ids must be distinct. Writes K/V at (slot, position) and attends to positions
        0..position of the row's slot. Returns final-normed hidden states (B, D).

        Attention reads the slots' K/V in place where it can. It runs over the view of slot
        range min(slot_ids)..max(slot_ids) and the first max(positions)+1 positions, with a mask
        for shorter rows. When that range holds other slots, each row's query is scattered to
        its slot's place and slots not in the batch get a dummy query whose output is dropped.
        Only when the range is more than twice the batch (slots far apart) are the rows'
        K/V gathered (a copy of B * heads * len * head_dim per layer) instead. The scheduler
        handing out the lowest free slot id and the runner ordering rows by slot keep the
        common case a plain view.
        """
        s = self.shape
        num_rows = embeds.shape[0]
        # Python ints for the views: one host read of two small tensors per step.
        slot_list = slot_ids.tolist()
        first_slot, last_slot = min(slot_list), max(slot_list)
        attend_len = int(positions.max()) + 1
        num_range = last_slot - first_slot + 1
        packed = num_range == num_rows and slot_list == list(range(first_slot, last_slot + 1))
        gather = num_range > 2 * num_rows

        cos = self.rope_cos[positions][:, None]  # (B, 1, hd)
        sin = self.rope_sin[positions][:, None]
        key_pos = torch.arange(attend_len, device=embeds.device)
        rel = None  # row -> index within the slot range, when queries are scattered
        if packed or gather:
            mask = key_pos[None, :] <= positions[:, None]  # (B, attend_len)
        else:
            rel = slot_ids - first_slot
            # Slots in the range but not in the batch see only position 0 (finite, dropped).
            range_pos = torch.zeros(num_range, dtype=positions.dtype, device=positions.device)
            range_pos[rel] = positions
            mask = key_pos[None, :] <= range_pos[:, None]  # (range, attend_len)
            q_range = embeds.new_zeros(num_range, s.num_heads, 1, s.head_dim)
        mask = mask[:, None, None, :]

        x = embeds
        for i, layer in enumerate(cast("list[_Layer]", self.layers)):
            q, k, v = self._qkv(layer, x, cos, sin)
            k_cache, v_cache = cache.kv[i, 0], cache.kv[i, 1]
            k_cache[slot_ids, :, positions] = k
            v_cache[slot_ids, :, positions] = v
            if gather:
                keys = k_cache[:, :, :attend_len].index_select(0, slot_ids)
                values = v_cache[:, :, :attend_len].index_select(0, slot_ids)
            else:
                keys = k_cache[first_slot : last_slot + 1, :, :attend_len]
                values = v_cache[first_slot : last_slot + 1, :, :attend_len]
            if rel is None:
                query = q[:, :, None]
            else:
                q_range[rel] = q[:, :, None]
                query = q_range
            attn = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, enable_gqa=self._gqa
            )  # (rows or range, heads, 1, hd)
            if rel is not None:
                attn = attn[rel]
            x = x + layer.o(attn.reshape(num_rows, -1))[0]
            x = x + layer.mlp(x)
        return _rms_norm(x, self.norm, s.rms_norm_eps)
