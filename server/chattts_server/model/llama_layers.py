"""The pieces of one Llama decoder layer, as transformers computes them: sizes, RMSNorm, rotary
embedding, the linear projections in every allowed mode, and the step from a layer's input to
its roped queries and stacked keys/values. `llama.py` runs them over a KV cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig

from .linear_modes import MODES, LinearMode, module_bytes


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


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # As LlamaRMSNorm: statistics in fp32, scale in the weights' dtype. In fp32 that is exactly
    # torch's fused rms_norm (one op instead of six, ~0.4 ms of a decode step on CPU).
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    # x: (rows, heads, head_dim); cos, signed_sin: (rows, 1, head_dim). transformers'
    # x * cos + cat(-x2, x1) * sin, with the sign folded into the table: cat(x2, x1) is a roll.
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class Projection(nn.Module):
    """``x @ W.T + b`` for one or more weights that read the same input (Q/K/V, gate/up), in
    every allowed linear mode (``model/linear_modes.py``); ``forward`` runs the one asked for.

    Modes with ``fuse`` stack the weights into one matmul and split its output. A mixed mode
    runs layer ``layer_id``'s kernel mode, sharing the kernels when that mode is built too.
    Outputs are in the kernel's ``input_dtype`` (bf16 for the bf16 and weight-only modes).
    """

    def __init__(
        self,
        weights: list[Tensor],
        biases: list[Tensor | None],
        modes: list[str],
        fuse_all: bool,
        layer_id: int = 0,
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
        built: dict[str, nn.ModuleList] = {}

        def kernels_of(mode: LinearMode) -> nn.ModuleList:
            if mode.name not in built:
                build = cast("Callable[[Tensor, Tensor | None], nn.Module]", mode.build)
                if mode.fuse or fuse_all or len(weights) == 1:
                    parts = [build(fused_w, fused_b)]
                else:
                    parts = [
                        build(w, b if has_bias else None)
                        for w, b in zip(weights, biases, strict=True)
                    ]
                built[mode.name] = nn.ModuleList(parts)
            return built[mode.name]

        self.kernels = nn.ModuleDict(
            {name: kernels_of(MODES[name].for_layer(layer_id)) for name in modes}
        )

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

    def nbytes(self, mode: str | None = None) -> int:
        """Bytes of one mode's kernels, or (None) of every kernel held, shared ones once."""
        held = (
            [self.kernels[mode]]
            if mode
            else list({id(k): k for k in self.kernels.values()}.values())
        )
        return sum(module_bytes(k) for parts in held for k in cast("nn.ModuleList", parts))


class Layer(nn.Module):
    """One decoder layer's weights."""

    input_norm: Tensor
    post_norm: Tensor

    def __init__(
        self,
        sd: Mapping[str, Tensor],
        layer_id: int,
        eps: float,
        modes: list[str],
        fuse_all: bool,
    ) -> None:
        super().__init__()
        self.eps = eps
        prefix = f"layers.{layer_id}."

        def proj(names: list[str]) -> Projection:
            weights = [sd[f"{prefix}{n}.weight"] for n in names]
            biases = [sd.get(f"{prefix}{n}.bias") for n in names]
            return Projection(weights, biases, modes, fuse_all, layer_id)

        self.register_buffer("input_norm", sd[prefix + "input_layernorm.weight"])
        self.register_buffer("post_norm", sd[prefix + "post_attention_layernorm.weight"])
        self.qkv = proj([f"self_attn.{p}_proj" for p in "qkv"])
        self.o = proj(["self_attn.o_proj"])
        self.gate_up = proj(["mlp.gate_proj", "mlp.up_proj"])
        self.down = proj(["mlp.down_proj"])

    def projections(self) -> list[Projection]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def mlp(self, x: Tensor, mode: str) -> Tensor:
        """The MLP's output in the down kernel's dtype (the residual add promotes it)."""
        gate, up = self.gate_up(rms_norm(x, self.post_norm, self.eps), mode)
        return self.down(F.silu(gate) * up, mode)[0]


def q_kv(
    shape: LlamaShape, layer: Layer, x: Tensor, cos: Tensor, sin: Tensor, mode: str
) -> tuple[Tensor, Tensor]:
    """x: (rows, hidden) -> q (rows, heads, hd) roped and kv (rows, 2, kv_heads, hd) with k
    roped: the layout one index_put writes into the cache. From a stacked Q/K/V matmul q and k
    are roped in one go (a decode step is ~700 small ops; this saves ~150)."""
    s = shape
    rows, num_qk = x.shape[0], s.num_heads + s.num_kv_heads
    h = rms_norm(x, layer.input_norm, s.rms_norm_eps)
    y = layer.qkv.fused(h, mode)
    if y is None:  # separate Q, K and V kernels
        q, k, v = layer.qkv(h, mode)
        q = apply_rope(q.view(rows, s.num_heads, s.head_dim), cos, sin)
        k = apply_rope(k.view(rows, s.num_kv_heads, s.head_dim), cos, sin)
        return q, torch.stack((k, v.view(rows, s.num_kv_heads, s.head_dim)), dim=1)
    qk = apply_rope(y[:, : num_qk * s.head_dim].view(rows, num_qk, s.head_dim), cos, sin)
    v = y[:, num_qk * s.head_dim :].view(rows, s.num_kv_heads, s.head_dim)
    return qk[:, : s.num_heads], torch.stack((qk[:, s.num_heads :], v), dim=1)
