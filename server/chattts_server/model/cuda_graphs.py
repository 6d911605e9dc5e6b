"""CUDA graphs for the decode step: one captured graph per (batch size, attention length).

A decode step of B rows whose longest row attends to P positions runs the graph of the
smallest captured batch size >= B and the smallest captured length >= P: the rows are copied
into that graph's static input buffers, the padding rows point at a scratch KV slot (never
handed to a request), the graph replays, and the first B rows of the static output are the
result. Lengths come in buckets (doubling up to the slot size) so attention reads at most
about twice the K/V it needs. Capture happens at warm-up, largest first, all graphs sharing
one memory pool; health reports SERVING only after every graph is captured.

The bookkeeping (sizes, padding, buffers) is device-independent: with `capture=False` the same
object runs the step function eagerly over the same padded static buffers, which is how CPU
tests pin it down. The step function must be graph-safe: fixed shapes for a given batch size
and no host reads (`LlamaDecoder.decode_static`).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

DecodeFn = Callable[[Tensor, Tensor, Tensor, int], Tensor]
"""(slot_ids (B,), embeds (B, D), positions (B,), attend_len) -> hidden (B, D); attends to the
first attend_len positions of each row's slot (masked beyond the row's own position)."""


def length_buckets(max_tokens: int, smallest: int = 128) -> list[int]:
    """Attention lengths to capture: doubling from `smallest`, and the slot size."""
    buckets, length = [], smallest
    while length < max_tokens:
        buckets.append(length)
        length *= 2
    return [*buckets, max_tokens]


@dataclass
class _Buffers:
    """One batch size's static inputs, shared by the graphs of every attention length."""

    slot_ids: Tensor  # (size,) long
    positions: Tensor  # (size,) long
    embeds: Tensor  # (size, D)
    out: dict[int, Tensor] = field(default_factory=dict)  # attend_len -> (size, D) output
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)


class DecodeGraphs:
    def __init__(
        self,
        step: DecodeFn,
        sizes: Sequence[int],
        lengths: Sequence[int],
        hidden_size: int,
        scratch_slot: int,
        device: torch.device,
        dtype: torch.dtype,
        capture: bool,
    ) -> None:
        """`sizes`: the batch sizes to capture (each decode batch pads to the next one);
        `lengths`: the attention lengths (see `length_buckets`); `scratch_slot`: a KV slot no
        request uses, written by padding rows; `capture`: CUDA graphs, else eager replays."""
        if not sizes or min(sizes) < 1 or not lengths or min(lengths) < 1:
            raise ValueError("need at least one batch size and one length >= 1")
        self.step = step
        self.sizes = sorted(set(sizes))
        self.lengths = sorted(set(lengths))
        self.scratch_slot = scratch_slot
        self.capture = capture
        self._buffers = {
            size: _Buffers(
                slot_ids=torch.full((size,), scratch_slot, dtype=torch.long, device=device),
                positions=torch.zeros(size, dtype=torch.long, device=device),
                embeds=torch.zeros(size, hidden_size, dtype=dtype, device=device),
            )
            for size in self.sizes
        }
        self._pool: Any = None  # the graphs' shared memory pool, from the first capture
        self.num_replays = 0

    def padded_size(self, num_rows: int) -> int:
        """The captured batch size a batch of `num_rows` runs at."""
        return _bucket(self.sizes, num_rows, "batch size")

    def padded_length(self, attend_len: int) -> int:
        """The captured attention length for rows attending to `attend_len` positions."""
        return _bucket(self.lengths, attend_len, "attention length")

    def capture_all(self) -> None:
        """Capture every (size, length), largest first, in one shared memory pool; eager mode
        runs each once (what warm-up needs either way)."""
        for size in reversed(self.sizes):
            buf = self._buffers[size]
            for length in reversed(self.lengths):
                if not self.capture:
                    buf.out[length] = self.step(buf.slot_ids, buf.embeds, buf.positions, length)
                    continue
                # Warm up on a side stream (lazy inits, autotuning) before capture, as PyTorch
                # asks, then capture into the pool the first graph created.
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self.step(buf.slot_ids, buf.embeds, buf.positions, length)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    buf.out[length] = self.step(buf.slot_ids, buf.embeds, buf.positions, length)
                self._pool = graph.pool()
                buf.graphs[length] = graph
        log.info(
            "decode %s for batch sizes %s x attention lengths %s",
            "CUDA graphs captured" if self.capture else "runs eagerly (no CUDA graphs)",
            self.sizes,
            self.lengths,
        )

    def __call__(
        self, slot_ids: Tensor, embeds: Tensor, positions: Tensor, max_position: int
    ) -> Tensor:
        """Decode B rows (the largest of `positions` is `max_position`, known to the caller
        without a device read) through the padded static buffers; (B, D), valid until the next
        call."""
        num_rows = embeds.shape[0]
        buf = self._buffers[self.padded_size(num_rows)]
        length = self.padded_length(max_position + 1)
        buf.slot_ids[:num_rows].copy_(slot_ids)
        buf.slot_ids[num_rows:].fill_(self.scratch_slot)
        buf.positions[:num_rows].copy_(positions)
        buf.positions[num_rows:].zero_()
        buf.embeds[:num_rows].copy_(embeds)
        graph = buf.graphs.get(length)
        if graph is not None:
            graph.replay()
        else:
            buf.out[length] = self.step(buf.slot_ids, buf.embeds, buf.positions, length)
        self.num_replays += 1
        return buf.out[length][:num_rows]


def _bucket(buckets: list[int], value: int, what: str) -> int:
    i = bisect.bisect_left(buckets, value)
    if i == len(buckets):
        raise ValueError(f"{what} {value} exceeds the largest captured {buckets[-1]}")
    return buckets[i]
