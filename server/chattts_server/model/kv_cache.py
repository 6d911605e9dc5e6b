"""The one preallocated K/V tensor every request's slot lives in (the runner owns it)."""

from __future__ import annotations

import torch

from .llama_layers import LlamaShape


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
