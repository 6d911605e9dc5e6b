"""Attention weights of a few heads, from chosen rows of a forward over their prompt's text, as
`GPTModel.forward` returns them (`AttentionWeights`), normalized over the text positions only:
their argmax (the alignment) is the same, and the rest of the prompt does not dilute them.

- torch (`AlignmentCapture`): ``scaled_dot_product_attention`` returns no weights, so after each
  layer that holds a chosen head, each chosen row's roped query meets the keys at its slot's text
  positions (prompt positions, in the cache) in one small matmul, softmaxed. A forward without
  one computes nothing extra (`LlamaDecoder._forward` checks for None once per layer).
- llama.cpp (`LlamaCppAlignment`): what its eval callback hands over (`engine/llamacpp_tap.py`,
  made with the context), cut to the text positions and renormalized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from ..model.kv_cache import SlotKVCache
from ..model.llama_layers import LlamaShape
from .types import CaptureRow, HeadId


class AttentionWeights(Protocol):
    """What a forward returns of the heads it was asked to capture, whatever ran it."""

    @property
    def rows(self) -> Sequence[CaptureRow]: ...

    @property
    def order(self) -> list[HeadId]:
        """The heads in the order of `row_weights`' rows."""
        ...

    def row_weights(self, row: int) -> Tensor:
        """(len(heads), text tokens): one row's weights over its text, summing to one."""
        ...


def _by_layer(heads: Sequence[HeadId]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for layer, head in heads:
        grouped.setdefault(layer, []).append(head)
    return grouped


def _order(grouped: dict[int, list[int]]) -> list[HeadId]:
    """The heads by layer, then as given: the order of `row_weights`' rows."""
    return [(layer, h) for layer in sorted(grouped) for h in grouped[layer]]


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
        self._by_layer = _by_layer(self.heads)
        self._head_index = {
            layer: torch.tensor(heads, device=self.cache.kv.device)
            for layer, heads in self._by_layer.items()
        }

    @property
    def order(self) -> list[HeadId]:
        return _order(self._by_layer)

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


class LlamaCppAlignment:
    """The alignment heads' weights for rows of one llama.cpp decode batch, read from what its
    attention tap found."""

    def __init__(self, heads: tuple[HeadId, ...], rows: list[CaptureRow]) -> None:
        self.rows = rows
        self._by_layer = _by_layer(heads)
        self.weights: dict[int, Tensor] = {}
        """CaptureRow.row -> (heads in `order`, text tokens)."""

    @property
    def layers(self) -> set[int]:
        return set(self._by_layer)

    @property
    def order(self) -> list[HeadId]:
        return _order(self._by_layer)

    def row_weights(self, row: int) -> Tensor:
        return self.weights[row]

    def read(self, found: dict[int, list[np.ndarray]], runs: list[list[int]]) -> None:
        """`found` from the tap over a decode-only call whose micro-batches were `runs` (each
        the decode rows of consecutive sequences, one token each): per layer, one (streams,
        heads, tokens per stream, cells) array per micro-batch, cell i holding position i."""
        where = {row: (r, i) for r, run in enumerate(runs) for i, row in enumerate(run)}
        for capture in self.rows:
            run, stream = where[capture.row]
            parts = []
            for layer in sorted(self._by_layer):
                block = found[layer][run][stream, self._by_layer[layer], 0]  # (heads, cells)
                text = block[:, capture.text_start : capture.text_end]
                parts.append(text / np.maximum(text.sum(axis=1, keepdims=True), 1e-30))
            self.weights[capture.row] = torch.from_numpy(np.concatenate(parts))
