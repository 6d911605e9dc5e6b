"""Attention weights of a few heads, from chosen rows of a forward over their prompt's text.

The main attention runs through ``scaled_dot_product_attention``, which returns no weights. For
the alignment heads (`model/alignment_heads.py`) a forward may carry an `AlignmentCapture`:
after each layer that holds a chosen head, for each chosen row, one small matmul of the row's
roped query with the keys at its slot's text positions (already in the cache: they are prompt
positions), scaled and softmaxed over those positions. A forward without one computes nothing
extra (`LlamaDecoder._forward` checks for None once per layer).

The weights are normalized over the text positions only, not over every key the row attends
to: their argmax (the alignment) is the same, and the rest of the prompt and the audio so far
do not dilute them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from .alignment_heads import HeadId
from .kv_cache import SlotKVCache
from .llama_layers import LlamaShape


@dataclass(frozen=True)
class CaptureRow:
    """One row of a forward whose weights over its slot's text positions are wanted."""

    row: int
    """Its index among the forward's rows (for `LlamaDecoder.forward_batch`: among the decode
    batch's rows)."""
    slot_id: int
    text_start: int
    """Prompt positions [text_start, text_end) of the slot hold the text tokens."""
    text_end: int


class AttentionWeights(Protocol):
    """What a forward returns of the heads it was asked to capture, whatever ran it (this
    module's `AlignmentCapture` on torch, `engine/llamacpp_gpt.LlamaCppAlignment`)."""

    @property
    def rows(self) -> Sequence[CaptureRow]: ...

    @property
    def order(self) -> list[HeadId]:
        """The heads in the order of `row_weights`' rows."""
        ...

    def row_weights(self, row: int) -> Tensor:
        """(len(heads), text tokens): one row's weights over its text, summing to one."""
        ...


@dataclass
class AlignmentCapture:
    heads: Sequence[HeadId]
    rows: Sequence[CaptureRow]
    cache: SlotKVCache
    shape: LlamaShape
    row_offset: int = 0
    """Rows of the forward before the first `CaptureRow.row` (prompt chunks in a packed one)."""
    weights: dict[int, list[Tensor]] = field(default_factory=dict)
    """Filled by the forward: CaptureRow.row -> per layer with chosen heads, in layer order,
    (that layer's chosen heads, text_end - text_start) fp32 weights (see `row_weights`)."""

    def __post_init__(self) -> None:
        self._by_layer: dict[int, list[int]] = {}
        for layer, head in self.heads:
            self._by_layer.setdefault(layer, []).append(head)
        self._head_index = {
            layer: torch.tensor(heads, device=self.cache.kv.device)
            for layer, heads in self._by_layer.items()
        }

    @property
    def order(self) -> list[HeadId]:
        """The heads in the order of `row_weights`' rows: by layer, then as given."""
        return [(layer, h) for layer in sorted(self._by_layer) for h in self._by_layer[layer]]

    def row_weights(self, row: int) -> Tensor:
        """(len(heads), text tokens): one row's weights, heads in `order`."""
        return torch.cat(self.weights[row])

    def __call__(self, layer_id: int, q: Tensor) -> None:
        """`q` (rows, heads, hd): the layer's roped queries; its K/V are in the cache."""
        head_index = self._head_index.get(layer_id)
        if head_index is None:
            return
        kv_index = head_index // (self.shape.num_heads // self.shape.num_kv_heads)
        scale = self.shape.head_dim**-0.5
        for r in self.rows:
            keys = self.cache.kv[layer_id, 0, r.slot_id, kv_index, r.text_start : r.text_end]
            query = q[self.row_offset + r.row, head_index].float()  # (n, hd)
            scores = torch.einsum("nd,ntd->nt", query, keys.float()) * scale
            self.weights.setdefault(r.row, []).append(scores.softmax(dim=-1))
