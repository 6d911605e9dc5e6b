"""Our forward pass for ChatTTS's GPT (a transformers ``LlamaModel`` fed with ``inputs_embeds``).

It reads the same weights and config as ``LlamaModel`` but keeps K/V in one preallocated
:class:`SlotKVCache`, so that a decode step can run many requests together, each in its own slot
and at its own position (continuous batching). Numerics follow transformers: RMSNorm in fp32,
rotary tables computed in fp32 then cast, attention through ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from . import linear_modes
from .linear_modes import MODES, module_bytes

if TYPE_CHECKING:
    from .autotune import AutotuneResult

log = logging.getLogger(__name__)

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
    positions are finite (a masked NaN would still poison the softmax). Its device must be the
    decoder's and its dtype the decoder's ``kv_dtype``.
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
    # As LlamaRMSNorm: statistics in fp32, scale in the weights' dtype. In fp32 that is exactly
    # torch's fused rms_norm (one op instead of six, ~0.4 ms of a decode step on CPU).
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    # x: (rows, heads, head_dim); cos, signed_sin: (rows, 1, head_dim). transformers'
    # x * cos + cat(-x2, x1) * sin, with the sign folded into the table: cat(x2, x1) is a roll.
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class _Projection(nn.Module):
    """``x @ W.T + b`` for one or more weights that read the same input (Q/K/V, gate/up), in
    every allowed linear mode (``model/linear_modes.py``); ``forward`` runs the one asked for.

    Modes with ``fuse`` stack the weights into one matmul and split its output.
    """

    def __init__(
        self, weights: list[Tensor], biases: list[Tensor | None], modes: list[str], fuse_all: bool
    ) -> None:
        super().__init__()
        self.sizes = [w.shape[0] for w in weights]
        has_bias = all(b is not None for b in biases)
        fused_w = torch.cat(weights, dim=0) if len(weights) > 1 else weights[0]
        fused_b = (
            torch.cat(cast("list[Tensor]", biases), dim=0)
            if has_bias and len(weights) > 1
            else biases[0]
            if has_bias
            else None
        )
        self.kernels = nn.ModuleDict()
        for name in modes:
            mode = MODES[name]
            if mode.fuse or fuse_all or len(weights) == 1:
                parts = [mode.build(fused_w, fused_b)]
            else:
                parts = [
                    mode.build(w, b if has_bias else None)
                    for w, b in zip(weights, biases, strict=True)
                ]
            self.kernels[name] = nn.ModuleList(parts)

    def forward(self, x: Tensor, mode: str) -> list[Tensor]:
        parts = cast("nn.ModuleList", self.kernels[mode])
        if len(parts) > 1:
            return [kernel(x) for kernel in parts]
        y = parts[0](x)
        return [y] if len(self.sizes) == 1 else list(y.split(self.sizes, dim=-1))

    def fused(self, x: Tensor, mode: str) -> Tensor | None:
        """The stacked output (rows, sum of sizes) when ``mode`` runs one matmul, else None."""
        parts = cast("nn.ModuleList", self.kernels[mode])
        return parts[0](x) if len(parts) == 1 else None

    def drop(self, keep: set[str]) -> None:
        for name in [n for n in self.kernels if n not in keep]:
            del self.kernels[name]

    def nbytes(self, mode: str) -> int:
        return sum(module_bytes(k) for k in cast("nn.ModuleList", self.kernels[mode]))


class _Layer(nn.Module):
    """One decoder layer's weights."""

    input_norm: Tensor
    post_norm: Tensor

    def __init__(
        self, sd: Mapping[str, Tensor], prefix: str, eps: float, modes: list[str], fuse_all: bool
    ) -> None:
        super().__init__()
        self.eps = eps

        def proj(names: list[str]) -> _Projection:
            weights = [sd[f"{prefix}{n}.weight"] for n in names]
            biases = [sd.get(f"{prefix}{n}.bias") for n in names]
            return _Projection(weights, biases, modes, fuse_all)

        self.register_buffer("input_norm", sd[prefix + "input_layernorm.weight"])
        self.register_buffer("post_norm", sd[prefix + "post_attention_layernorm.weight"])
        self.qkv = proj([f"self_attn.{p}_proj" for p in "qkv"])
        self.o = proj(["self_attn.o_proj"])
        self.gate_up = proj(["mlp.gate_proj", "mlp.up_proj"])
        self.down = proj(["mlp.down_proj"])

    def projections(self) -> list[_Projection]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def mlp(self, x: Tensor, mode: str) -> Tensor:
        gate, up = self.gate_up(_rms_norm(x, self.post_norm, self.eps), mode)
        return self.down(F.silu(gate) * up, mode)[0]


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
        sin[:, : sin.shape[1] // 2] *= -1
        self.register_buffer("rope_cos", cos.to(device=norm.device, dtype=norm.dtype))
        self.register_buffer("rope_sin", sin.to(device=norm.device, dtype=norm.dtype))
        self._gqa = shape.num_kv_heads != shape.num_heads
        self.quantize = "none"
        self.kv_dtype = norm.dtype
        """What the SlotKVCache should hold; attention runs in it (output back to fp32)."""
        self._mode_table: dict[int, str] = {}
        self.prefill_mode: str | None = None
        """The mode prefill uses; None: the largest decode batch size's."""
        self._mode_by_rows: list[str] = []

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
        :attr:`kv_dtype`); by default the model dtype, except that a lossy ``quantize`` on CPU
        with fast bf16 keeps K/V in bf16: at 16 streams attention reads as many bytes of K/V
        per step as the int8 weights, and halving them took 14 -> 8 ms of a 50 ms step.
        """
        device = torch.device(device)
        names = modes or linear_modes.modes_for(quantize, device, dtype)
        if "dense-onednn" in names:  # the default before autotune: 1.7x F.linear on some CPUs
            names = ["dense-onednn", *(n for n in names if n != "dense-onednn")]
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
        fuse_all = device.type != "cpu"
        layers = [
            _Layer(sd, f"layers.{i}.", shape.rms_norm_eps, names, fuse_all)
            for i in range(shape.num_layers)
        ]
        model = cls(shape, layers, sd["norm.weight"], inv_freq, float(attention_scaling))
        model.quantize = quantize if modes is None else "explicit"
        if kv_dtype is None:
            lossy = modes is None and quantize != "none"
            bf16_kv = lossy and linear_modes.MODES["bf16"].available(device, dtype)
            kv_dtype = torch.bfloat16 if bf16_kv else dtype
        model.kv_dtype = kv_dtype
        model.set_mode_table({1: names[0]})
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
        return list(cast("_Layer", self.layers[0]).qkv.kernels.keys())

    @property
    def mode_table(self) -> dict[int, str]:
        """Decode batch size -> linear mode; a batch of B rows uses the entry of the smallest
        size >= B (the largest size beyond the table). Prefill uses the largest size's mode."""
        return dict(self._mode_table)

    def set_mode_table(self, table: Mapping[int, str]) -> None:
        unknown = set(table.values()) - set(self.modes)
        if unknown or not table:
            raise ValueError(f"modes {sorted(unknown)} not built (have {self.modes})")
        self._mode_table = dict(sorted(table.items()))
        sizes = list(self._mode_table)
        self._mode_by_rows = [
            self._mode_table[next((b for b in sizes if b >= rows), sizes[-1])]
            for rows in range(sizes[-1] + 1)
        ]

    def mode_for(self, num_rows: int) -> str:
        return self._mode_by_rows[min(num_rows, len(self._mode_by_rows) - 1)]

    def weight_bytes(self, mode: str | None = None) -> int:
        """Bytes of linear weights held, for one mode or (None) all of them."""
        projections = [p for layer in self.layers for p in cast("_Layer", layer).projections()]
        return sum(p.nbytes(m) for p in projections for m in ([mode] if mode else self.modes))

    def keep_modes(self, keep: set[str]) -> None:
        """Free the weights of every mode not in ``keep`` (after autotune)."""
        if not keep or keep - set(self.modes):
            raise ValueError(f"cannot keep {sorted(keep)} of {self.modes}")
        for layer in self.layers:
            for proj in cast("_Layer", layer).projections():
                proj.drop(keep)
        if self.prefill_mode not in keep:
            self.prefill_mode = None
        self.set_mode_table(
            {b: m for b, m in self._mode_table.items() if m in keep} or {1: next(iter(keep))}
        )

    def autotune(
        self,
        batch_sizes: list[int],
        cache: SlotKVCache,
        probe: Tensor | None = None,
        min_snr_db: float = 30.0,
        steps: int = 5,
    ) -> AutotuneResult:
        """Time each allowed mode at each decode batch size and use the fastest from now on.

        Under ``quantize='auto'`` a lossy mode competes only if the hidden states it gives for
        ``probe`` (L, D) embeddings (default: random) are within ``min_snr_db`` of the lossless
        mode's. Logs the table and frees the weights of modes no size chose. Writes garbage into
        slots 0..max(batch_sizes)-1 of ``cache``: call it at warm-up, before any request.
        """
        from .autotune import autotune

        return autotune(self, batch_sizes, cache, probe, min_snr_db, steps)

    def _qkv(
        self, layer: _Layer, x: Tensor, cos: Tensor, sin: Tensor, mode: str
    ) -> tuple[Tensor, ...]:
        # x: (rows, hidden) -> q (rows, heads, hd), k and v (rows, kv_heads, hd); q, k roped.
        s = self.shape
        q, k, v = layer.qkv(_rms_norm(x, layer.input_norm, s.rms_norm_eps), mode)
        q = _apply_rope(q.view(x.shape[0], s.num_heads, s.head_dim), cos, sin)
        k = _apply_rope(k.view(x.shape[0], s.num_kv_heads, s.head_dim), cos, sin)
        return q, k, v.view(x.shape[0], s.num_kv_heads, s.head_dim)

    def _q_kv(
        self, layer: _Layer, x: Tensor, cos: Tensor, sin: Tensor, mode: str
    ) -> tuple[Tensor, Tensor]:
        # x: (rows, hidden) -> q (rows, heads, hd) roped and kv (rows, 2, kv_heads, hd) with k
        # roped: the layout one index_put writes into the cache. From a stacked Q/K/V matmul,
        # q and k are roped in one go (a decode step is ~700 small ops; this saves ~150).
        s = self.shape
        rows, num_qk = x.shape[0], s.num_heads + s.num_kv_heads
        h = _rms_norm(x, layer.input_norm, s.rms_norm_eps)
        y = layer.qkv.fused(h, mode)
        if y is None:
            q, k, v = self._qkv(layer, x, cos, sin, mode)
            return q, torch.stack((k, v), dim=1)
        qk = _apply_rope(y[:, : num_qk * s.head_dim].view(rows, num_qk, s.head_dim), cos, sin)
        v = y[:, num_qk * s.head_dim :].view(rows, s.num_kv_heads, s.head_dim)
        return qk[:, : s.num_heads], torch.stack((qk[:, s.num_heads :], v), dim=1)

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
        mode = mode or self.prefill_mode or self.mode_for(len(self._mode_by_rows))
        kv_dtype = cache.kv.dtype
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
            q, k, v = self._qkv(layer, x, cos, sin, mode)
            k_cache, v_cache = cache.kv[i, 0, slot_id], cache.kv[i, 1, slot_id]
            k_cache[:, start_pos:end_pos] = k.transpose(0, 1)
            v_cache[:, start_pos:end_pos] = v.transpose(0, 1)
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None].to(kv_dtype),
                k_cache[None, :, :end_pos],
                v_cache[None, :, :end_pos],
                attn_mask=mask,
                is_causal=causal,
                enable_gqa=self._gqa,
            )  # (1, heads, L, hd)
            attn = attn[0].transpose(0, 1).reshape(num_tokens, -1).to(x.dtype)
            x = x + layer.o(attn, mode)[0]
            x = x + layer.mlp(x, mode)
        return _rms_norm(x, self.norm, self.shape.rms_norm_eps)

    def decode(
        self,
        slot_ids: Tensor,
        embeds: Tensor,
        positions: Tensor,
        cache: SlotKVCache,
        mode: str | None = None,
    ) -> Tensor:
        """One token for each row: ``embeds`` (B, D) at ``positions`` (B,) of ``slot_ids`` (B,).

        Slot ids must be distinct. Writes K/V at (slot, position) and attends to positions
        0..position of the row's slot. Returns final-normed hidden states (B, D). The linear
        mode is the :attr:`mode_table`'s for B unless ``mode`` forces one.

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
        mode = mode or self.mode_for(num_rows)
        kv_dtype = cache.kv.dtype
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
            q_range = embeds.new_zeros(num_range, s.num_heads, 1, s.head_dim, dtype=kv_dtype)
        mask = mask[:, None, None, :]

        x = embeds
        for i, layer in enumerate(cast("list[_Layer]", self.layers)):
            q, kv = self._q_kv(layer, x, cos, sin, mode)
            # (2, slots, kv_heads, T, hd)[:, slot_ids, :, positions] is (B, 2, kv_heads, hd)
            cache.kv[i][:, slot_ids, :, positions] = kv.to(kv_dtype)
            k_cache, v_cache = cache.kv[i, 0], cache.kv[i, 1]
            if gather:
                keys = k_cache[:, :, :attend_len].index_select(0, slot_ids)
                values = v_cache[:, :, :attend_len].index_select(0, slot_ids)
            else:
                keys = k_cache[first_slot : last_slot + 1, :, :attend_len]
                values = v_cache[first_slot : last_slot + 1, :, :attend_len]
            if rel is None:
                query = q[:, :, None].to(kv_dtype)
            else:
                q_range[rel] = q[:, :, None].to(kv_dtype)
                query = q_range
            attn = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, enable_gqa=self._gqa
            )  # (rows or range, heads, 1, hd)
            if rel is not None:
                attn = attn[rel]
            x = x + layer.o(attn.reshape(num_rows, -1).to(x.dtype), mode)[0]
            x = x + layer.mlp(x, mode)
        return _rms_norm(x, self.norm, s.rms_norm_eps)

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
        s = self.shape
        num_rows = embeds.shape[0]
        mode = mode or self.mode_for(num_rows)
        kv_dtype = cache.kv.dtype
        cos = self.rope_cos[positions][:, None]  # (B, 1, hd)
        sin = self.rope_sin[positions][:, None]
        key_pos = torch.arange(attend_len, device=embeds.device)
        mask = (key_pos[None, :] <= positions[:, None])[:, None, None, :]  # (B, 1, 1, attend_len)
        x = embeds
        for i, layer in enumerate(cast("list[_Layer]", self.layers)):
            q, kv = self._q_kv(layer, x, cos, sin, mode)
            cache.kv[i][:, slot_ids, :, positions] = kv.to(kv_dtype)
            keys = cache.kv[i, 0, :, :, :attend_len].index_select(0, slot_ids)
            values = cache.kv[i, 1, :, :, :attend_len].index_select(0, slot_ids)
            attn = F.scaled_dot_product_attention(
                q[:, :, None].to(kv_dtype), keys, values, attn_mask=mask, enable_gqa=self._gqa
            )  # (B, heads, 1, hd)
            x = x + layer.o(attn.reshape(num_rows, -1).to(x.dtype), mode)[0]
            x = x + layer.mlp(x, mode)
        return _rms_norm(x, self.norm, s.rms_norm_eps)
