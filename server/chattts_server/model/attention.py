"""How a layer's queries meet the slot KV cache: one strategy per kind of forward.

Each strategy is built once per forward (its masks and index tensors shared by every layer) and
called once per layer with that layer's roped queries and stacked keys/values: it writes the K/V
into the cache and returns the attention output (rows, heads * head_dim) in the cache's dtype.
`LlamaDecoder` runs one layer body with whichever strategy the forward needs:

- `PrefillAttention`: one slot, a run of consecutive positions (a prompt or a chunk of one),
  causal over the slot's earlier positions too.
- `GatherAttention`: a decode batch, each row's K/V gathered from its slot (with fixed shapes
  and no host reads for CUDA graphs). The GPU replays it as a graph; a CPU runs torch only where
  llama.cpp does not load.
- `PackedAttention`: several of the above over consecutive runs of rows, for one forward that
  carries a whole engine step (prompt chunks and the decode batch share the weight reads).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from .kv_cache import SlotKVCache


class Attention(Protocol):
    def __call__(self, layer_id: int, q: Tensor, kv: Tensor) -> Tensor:
        """q (rows, heads, hd), kv (rows, 2, kv_heads, hd) -> (rows, heads * hd)."""
        ...


class PrefillAttention:
    def __init__(self, cache: SlotKVCache, slot_id: int, start_pos: int, num_tokens: int) -> None:
        self.cache, self.slot_id = cache, slot_id
        self.start, self.end = start_pos, start_pos + num_tokens
        device = cache.kv.device
        if start_pos == 0:
            self.mask, self.causal = None, True
        else:
            # Query i sits at start_pos + i and sees keys 0..start_pos + i.
            q_pos = torch.arange(self.start, self.end, device=device)
            k_pos = torch.arange(self.end, device=device)
            self.mask, self.causal = k_pos[None, :] <= q_pos[:, None], False

    def __call__(self, layer_id: int, q: Tensor, kv: Tensor) -> Tensor:
        slot = self.cache.kv[layer_id, :, self.slot_id]  # (2, kv_heads, T, hd)
        slot[:, :, self.start : self.end] = kv.permute(1, 2, 0, 3).to(slot.dtype)
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None].to(slot.dtype),
            slot[0, None, :, : self.end],
            slot[1, None, :, : self.end],
            attn_mask=self.mask,
            is_causal=self.causal,
            enable_gqa=q.shape[1] != kv.shape[2],
        )  # (1, heads, L, hd)
        return attn[0].transpose(0, 1).reshape(q.shape[0], -1)


def _write_rows(
    cache: SlotKVCache, layer_id: int, slot_ids: Tensor, positions: Tensor, kv: Tensor
) -> None:
    # (2, slots, kv_heads, T, hd)[:, slot_ids, :, positions] is (B, 2, kv_heads, hd)
    cache.kv[layer_id][:, slot_ids, :, positions] = kv.to(cache.kv.dtype)


class GatherAttention:
    def __init__(
        self, cache: SlotKVCache, slot_ids: Tensor, positions: Tensor, attend_len: int
    ) -> None:
        """Rows may share a slot only as padding (CUDA graphs): their writes are garbage."""
        self.cache, self.slot_ids, self.positions = cache, slot_ids, positions
        self.attend_len = attend_len
        key_pos = torch.arange(attend_len, device=positions.device)
        self.mask = (key_pos[None, :] <= positions[:, None])[:, None, None, :]  # (B,1,1,len)

    def __call__(self, layer_id: int, q: Tensor, kv: Tensor) -> Tensor:
        _write_rows(self.cache, layer_id, self.slot_ids, self.positions, kv)
        kv_layer = self.cache.kv[layer_id, :, :, :, : self.attend_len]
        keys = kv_layer[0].index_select(0, self.slot_ids)
        values = kv_layer[1].index_select(0, self.slot_ids)
        attn = F.scaled_dot_product_attention(
            q[:, :, None].to(keys.dtype),
            keys,
            values,
            attn_mask=self.mask,
            enable_gqa=q.shape[1] != kv.shape[2],
        )  # (B, heads, 1, hd)
        return attn.reshape(q.shape[0], -1)


class PackedAttention:
    """Rows in consecutive runs, each with its own strategy: ``parts`` is (rows, strategy) in
    row order. Every run writes and reads only its own slots, so the runs are independent."""

    def __init__(self, parts: list[tuple[int, Attention]]) -> None:
        self.sizes = [n for n, _ in parts]
        self.strategies = [strategy for _, strategy in parts]

    def __call__(self, layer_id: int, q: Tensor, kv: Tensor) -> Tensor:
        return torch.cat(
            [
                attend(layer_id, q_part, kv_part)
                for attend, q_part, kv_part in zip(
                    self.strategies, q.split(self.sizes), kv.split(self.sizes), strict=True
                )
            ]
        )
