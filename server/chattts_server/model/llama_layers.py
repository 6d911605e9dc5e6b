"""The pieces of one Llama decoder layer, as transformers computes them: sizes, RMSNorm, rotary
embedding, the linear projections, and the step from a layer's input to its roped queries and
stacked keys/values. `llama.py` runs them over a KV cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig


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
    """``x @ W.T + b`` for one or more weights that read the same input (Q/K/V, gate/up),
    stacked into one matmul whose output is split."""

    weight: Tensor
    bias: Tensor | None

    def __init__(self, weights: list[Tensor], biases: list[Tensor | None]) -> None:
        super().__init__()
        self.sizes = [w.shape[0] for w in weights]
        self.register_buffer("weight", torch.cat(weights) if len(weights) > 1 else weights[0])
        has_bias = all(b is not None for b in biases)
        bias = torch.cat(cast("list[Tensor]", biases)) if has_bias else None
        self.register_buffer("bias", bias)

    def fused(self, x: Tensor) -> Tensor:
        """The stacked output (rows, sum of sizes)."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> list[Tensor]:
        y = self.fused(x)
        return [y] if len(self.sizes) == 1 else list(y.split(self.sizes, dim=-1))


class Layer(nn.Module):
    """One decoder layer's weights."""

    input_norm: Tensor
    post_norm: Tensor

    def __init__(
        self,
        sd: Mapping[str, Tensor],
        layer_id: int,
        eps: float,
    ) -> None:
        super().__init__()
        self.eps = eps
        prefix = f"layers.{layer_id}."

        def proj(names: list[str]) -> Projection:
            weights = [sd[f"{prefix}{n}.weight"] for n in names]
            biases = [sd.get(f"{prefix}{n}.bias") for n in names]
            return Projection(weights, biases)

        self.register_buffer("input_norm", sd[prefix + "input_layernorm.weight"])
        self.register_buffer("post_norm", sd[prefix + "post_attention_layernorm.weight"])
        self.qkv = proj([f"self_attn.{p}_proj" for p in "qkv"])
        self.o = proj(["self_attn.o_proj"])
        self.gate_up = proj(["mlp.gate_proj", "mlp.up_proj"])
        self.down = proj(["mlp.down_proj"])

    def mlp(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(rms_norm(x, self.post_norm, self.eps))
        return self.down(F.silu(gate) * up)[0]


def q_kv(
    shape: LlamaShape, layer: Layer, x: Tensor, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor]:
    """x: (rows, hidden) -> q (rows, heads, hd) roped and kv (rows, 2, kv_heads, hd) with k
    roped: the layout one index_put writes into the cache. From a stacked Q/K/V matmul q and k
    are roped in one go (a decode step is ~700 small ops; this saves ~150)."""
    s = shape
    rows, num_qk = x.shape[0], s.num_heads + s.num_kv_heads
    h = rms_norm(x, layer.input_norm, s.rms_norm_eps)
    y = layer.qkv.fused(h)
    qk = apply_rope(y[:, : num_qk * s.head_dim].view(rows, num_qk, s.head_dim), cos, sin)
    v = y[:, num_qk * s.head_dim :].view(rows, s.num_kv_heads, s.head_dim)
    return qk[:, : s.num_heads], torch.stack((qk[:, s.num_heads :], v), dim=1)
