"""Per-slot sampling state for one head: parameters, generators, recent-token history.

Wraps `sampling.sample` for the runner: the parameter tensors (`SamplingBatch`) are rebuilt
only when the batch's membership changes, not every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .sampling import SamplingBatch, SamplingParams, TokenHistory, make_generator, sample


class SlotSampler:
    def __init__(
        self, num_slots: int, num_codebooks: int, vocab_size: int, eos_id: int, device: torch.device
    ) -> None:
        self.num_codebooks = num_codebooks
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.device = device
        self.history = TokenHistory(num_slots, num_codebooks, device)
        self._params: dict[int, SamplingParams] = {}
        self._generators: dict[int, torch.Generator | None] = {}
        self._version = 0
        self._batch_key: tuple[tuple[int, ...], int] | None = None
        self._batch: SamplingBatch | None = None
        self.shared_generator = torch.Generator(device="cpu").manual_seed(torch.seed() % 2**63)

    def set_row(self, slot_id: int, params: SamplingParams) -> None:
        """A new request takes `slot_id`: its parameters, its own generator, an empty history."""
        self._params[slot_id] = params
        self._generators[slot_id] = make_generator(params.seed)
        self.history.reset(slot_id)
        self._version += 1

    def sample(self, slot_ids: list[int], logits: Tensor, num_generated: list[int]) -> Tensor:
        """logits (B, Q, V) for the rows of `slot_ids`, whose passes have sampled
        `num_generated` tokens each so far -> tokens (B, Q) long."""
        key = (tuple(slot_ids), self._version)
        if key != self._batch_key:
            self._batch = SamplingBatch.build(
                [self._params[s] for s in slot_ids],
                [self._generators[s] for s in slot_ids],
                self.num_codebooks,
                self.vocab_size,
                self.eos_id,
                self.device,
            )
            self._batch_key = key
        assert self._batch is not None
        return sample(
            logits,
            self._batch,
            self.history.gather(self._index(slot_ids)) if self._batch.any_penalty else None,
            self._index(num_generated),
            self.shared_generator,
        )

    def append(self, slot_ids: list[int], tokens: Tensor, num_generated: list[int]) -> None:
        """Record the tokens (B, Q) that did not end their rows, sampled after
        `num_generated` tokens of their passes."""
        if slot_ids:
            self.history.append(self._index(slot_ids), tokens, self._index(num_generated))

    def _index(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
