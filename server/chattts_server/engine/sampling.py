"""Per-row sampling for a batch of requests, each with its own parameters.

Matches ChatTTS ``GPT.generate`` for one step: ``logits / temperature`` (per codebook),
repetition penalty (``CustomRepetitionPenaltyLogitsProcessorRepeat``: the last 16 generated
tokens of each codebook), top-p then top-k (transformers warpers with ``min_tokens_to_keep=3``),
EOS masked while fewer than ``min_new_tokens`` tokens have been generated, softmax, draw.

Where we differ from ChatTTS, on purpose:

- ``top_k == 1`` means greedy: the argmax of the penalised (and EOS-masked) logits, no draw.
  ChatTTS would raise k to 3 (``min_tokens_to_keep``) and sample among three; we keep that for
  ``top_k == 2``. ``top_k == 0`` disables top-k, ``top_p >= 1`` disables top-p in effect (as
  transformers' ``TopPLogitsWarper(1.0)``, it only drops tokens of probability exactly 0).
- The draw is inverse-CDF sampling with uniforms from each row's own ``torch.Generator`` (CPU),
  so a seeded row draws the same numbers whatever else is in the batch and on any device.
  ChatTTS uses ``torch.multinomial`` with one generator for the whole batch, so the same seed
  gives other tokens than upstream does.
- ChatTTS's processor passes ``max_input_ids=num_code`` but narrows the *row* axis of its
  frequency table with it, not the vocabulary, so in effect every id in the window is penalised
  (for batches of up to 625 rows). We penalise every id too; the difference could only show for
  EOS, which ends a row and so never sits in a live row's window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .utterance import SamplingParams

# transformers' TopP/TopK warpers as ChatTTS builds them (gen_logits: min_tokens_to_keep=3).
MIN_TOKENS_TO_KEEP = 3
# CustomRepetitionPenaltyLogitsProcessorRepeat's past_window in ChatTTS.
PENALTY_WINDOW = 16


def make_generator(seed: int | None) -> torch.Generator | None:
    """The per-request generator a seeded request keeps for its whole life (CPU, see module doc)."""
    return None if seed is None else torch.Generator(device="cpu").manual_seed(seed)


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row parameter tensors for one batch membership.

    Build it with :meth:`build` when rows join or leave, not every step. Row ``i`` holds the
    request whose logits are row ``i`` of what :func:`sample` gets.
    """

    temperature: Tensor  # (B, num_vq, 1) float
    top_p_cut: Tensor  # (B * num_vq, 1) float: drop sorted tokens with cumulative prob <= this
    top_k_index: Tensor  # (B * num_vq, 1) long: ascending-sorted index of the k-th largest logit
    penalty: Tensor  # (B, 1, 1) float
    min_new_tokens: Tensor  # (B,) long
    greedy: Tensor  # (B, 1) bool
    generators: tuple[torch.Generator | None, ...]  # per row; None uses the shared generator
    eos_id: int | None  # the id min_new_tokens masks; None masks nothing
    # Python-side flags so a batch that needs no penalty / filtering / EOS mask skips the work.
    any_penalty: bool
    any_filter: bool
    any_min_tokens: bool
    any_greedy: bool
    all_greedy: bool

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        num_vq: int,
        vocab_size: int,
        eos_id: int | None,
        device: torch.device | str,
    ) -> SamplingBatch:
        """Stack ``params`` (one per row) into tensors on ``device``."""
        temps = []
        for p in params:
            t = p.temperature
            row = [float(t)] * num_vq if isinstance(t, (int, float)) else [float(v) for v in t]
            if len(row) != num_vq:
                raise ValueError(f"temperature has {len(row)} values for {num_vq} codebooks")
            temps.append(row)
        top_k = [
            vocab_size if p.top_k <= 0 else min(max(p.top_k, MIN_TOKENS_TO_KEEP), vocab_size)
            for p in params
        ]
        num_rows = len(params)

        def per_code(values: list, dtype: torch.dtype) -> Tensor:
            t = torch.tensor(values, dtype=dtype, device=device)
            return t.repeat_interleave(num_vq).view(num_rows * num_vq, 1)

        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device).view(
                num_rows, num_vq, 1
            ),
            top_p_cut=per_code([1.0 - p.top_p for p in params], torch.float32),
            top_k_index=per_code([vocab_size - k for k in top_k], torch.long),
            penalty=torch.tensor(
                [p.repetition_penalty for p in params], dtype=torch.float32, device=device
            ).view(num_rows, 1, 1),
            min_new_tokens=torch.tensor(
                [p.min_new_tokens for p in params], dtype=torch.long, device=device
            ),
            greedy=torch.tensor([p.top_k == 1 for p in params], device=device).view(num_rows, 1),
            generators=tuple(generators),
            eos_id=eos_id,
            any_penalty=any(p.repetition_penalty != 1.0 for p in params),
            any_filter=any(p.top_p < 1.0 or 0 < p.top_k < vocab_size for p in params),
            any_min_tokens=eos_id is not None and any(p.min_new_tokens > 0 for p in params),
            any_greedy=any(p.top_k == 1 for p in params),
            all_greedy=all(p.top_k == 1 for p in params),
        )


class TokenHistory:
    """The last ``window`` tokens of every slot, per codebook, for the repetition penalty.

    Allocated once for all slots (a ring buffer; order within the window does not matter to a
    frequency count). ``-1`` marks an empty entry. The token counts that place each token in
    the ring are the caller's (the scheduler keeps the one count of a pass's tokens).
    """

    def __init__(
        self, num_slots: int, num_vq: int, device: torch.device | str, window: int = PENALTY_WINDOW
    ) -> None:
        self.window = window
        self.tokens = torch.full((num_slots, num_vq, window), -1, dtype=torch.long, device=device)

    def reset(self, slot_id: int) -> None:
        """Forget a slot's tokens; call when a request takes the slot."""
        self.tokens[slot_id] = -1

    def append(self, slot_ids: Tensor, tokens: Tensor, num_generated: Tensor) -> None:
        """Record one new token per row: ``tokens`` (B, num_vq) for ``slot_ids`` (B,), each
        the ``num_generated`` (B,)-th of its pass (0 for the first)."""
        self.tokens[slot_ids, :, num_generated % self.window] = tokens

    def gather(self, slot_ids: Tensor) -> Tensor:
        """(B, num_vq, window) tokens of ``slot_ids``."""
        return self.tokens[slot_ids]


def apply_repetition_penalty(logits: Tensor, history: Tensor, penalty: Tensor) -> Tensor:
    """ChatTTS's repetition penalty, per row and codebook.

    logits (B, Q, V); history (B, Q, W) long with -1 for empty; penalty (B, 1, 1).
    Each id seen ``n`` times in the window has its logit multiplied by ``penalty**n`` when
    negative and divided by it otherwise.
    """
    valid = history >= 0
    freq = torch.zeros_like(logits).scatter_add_(
        2, history.clamp(min=0), valid.to(logits.dtype)
    )  # (B, Q, V)
    alpha = torch.pow(penalty, freq)
    return torch.where(logits < 0, logits * alpha, logits / alpha)


def _uniforms(
    batch: SamplingBatch, num_vq: int, shared: torch.Generator | None, device: torch.device
) -> Tensor:
    # One draw per (row, codebook), from the row's generator; on the CPU so seeds give the
    # same numbers on every device.
    u = torch.empty(len(batch.generators), num_vq)
    shared_rows = [i for i, g in enumerate(batch.generators) if g is None]
    if shared_rows:
        u[shared_rows] = torch.rand(len(shared_rows), num_vq, generator=shared)
    for i, g in enumerate(batch.generators):
        if g is not None:
            u[i] = torch.rand(num_vq, generator=g)
    return u.to(device, non_blocking=True)


def filter_sorted(flat_logits: Tensor, batch: SamplingBatch) -> tuple[Tensor, Tensor]:
    """Top-p then top-k, as transformers' warpers with ``min_tokens_to_keep=3``.

    flat_logits (B * Q, V). Returns the logits sorted ascending, with removed tokens at -inf,
    and their vocabulary ids; sampling then works in sorted order without scattering back.
    """
    sorted_logits, sorted_ids = torch.sort(flat_logits, dim=-1)
    if batch.any_filter:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= batch.top_p_cut
        remove[:, -MIN_TOKENS_TO_KEEP:] = False
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        # Still ascending (top-p drops a prefix), so the k-th largest sits at V - k.
        kth = sorted_logits.gather(1, batch.top_k_index)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    return sorted_logits, sorted_ids


def sample(
    logits: Tensor,
    batch: SamplingBatch,
    history: Tensor | None,
    num_generated: Tensor,
    shared_generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one token per row and codebook.

    logits (B, Q, V) from the audio heads (Q = num_vq) or the text head (Q = 1); history
    (B, Q, W) long, -1 for empty, or None when no row has a penalty; num_generated (B,) long,
    tokens each row has generated before this one. Returns (B, Q) long.
    """
    num_rows, num_vq, vocab = logits.shape
    logits = logits.float() / batch.temperature
    if batch.any_penalty and history is not None:
        logits = apply_repetition_penalty(logits, history, batch.penalty)
    flat = logits.view(num_rows * num_vq, vocab)
    # (B * Q, V) True at EOS for rows that have not reached min_new_tokens yet.
    eos_block = None
    if batch.any_min_tokens and batch.eos_id is not None:
        early = (num_generated < batch.min_new_tokens).repeat_interleave(num_vq)
        is_eos = torch.arange(vocab, device=flat.device) == batch.eos_id
        eos_block = early[:, None] & is_eos[None, :]

    greedy_tokens = None
    if batch.any_greedy:
        masked = flat if eos_block is None else flat.masked_fill(eos_block, float("-inf"))
        greedy_tokens = masked.argmax(dim=-1).view(num_rows, num_vq)
        if batch.all_greedy:
            return greedy_tokens

    sorted_logits, sorted_ids = filter_sorted(flat, batch)
    if eos_block is not None:
        sorted_logits = sorted_logits.masked_fill(eos_block.gather(1, sorted_ids), float("-inf"))

    # Inverse CDF: the first sorted token whose cumulative probability exceeds u.
    cdf = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    u = _uniforms(batch, num_vq, shared_generator, logits.device).view(-1, 1)
    pick = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=vocab - 1)
    tokens = sorted_ids.gather(1, pick).view(num_rows, num_vq)
    if greedy_tokens is not None:
        tokens = torch.where(batch.greedy, greedy_tokens, tokens)
    return tokens
