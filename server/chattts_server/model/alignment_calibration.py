"""Every head's attention over one prompt's text while the GPT speaks it: the calibration at
load that picks the alignment heads (`alignment_heads.choose_heads`).

The caller prefills the prompt into a slot; it is then decoded step by step, each step's input
made from the last hidden state by the caller (the runner: the greedy audio code's embedding), with an
`AlignmentCapture` of every (layer, head) on the one row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from .alignment_capture import AlignmentCapture, CaptureRow
from .alignment_heads import HeadId
from .kv_cache import SlotKVCache
from .llama import LlamaDecoder


@torch.inference_mode()
def head_weights(
    decoder: LlamaDecoder,
    cache: SlotKVCache,
    slot_id: int,
    prompt_hidden: Tensor,
    text: tuple[int, int],
    next_embed: Callable[[Tensor], Tensor],
    steps: int,
) -> dict[HeadId, np.ndarray]:
    """(steps, text tokens) weights of every head: `prompt_hidden` (L, D) is what prefilling
    the prompt into `slot_id` returned; its positions [text[0], text[1]) are the text. Then
    `steps` decode steps, the input of each `next_embed(last hidden state (D,)) -> (D,)`."""
    shape = decoder.shape
    heads = [(layer, head) for layer in range(shape.num_layers) for head in range(shape.num_heads)]
    rows = [CaptureRow(0, slot_id, text[0], text[1])]
    hidden, position = prompt_hidden[-1], prompt_hidden.shape[0]
    device, dtype = prompt_hidden.device, decoder.norm.dtype
    slots = torch.tensor([slot_id], device=device)
    found: list[Tensor] = []
    for _ in range(steps):
        if position >= cache.kv.shape[4]:  # the slot is full
            break
        capture = AlignmentCapture(heads, rows, cache, shape)
        positions = torch.tensor([position], device=device)
        embed = next_embed(hidden).to(dtype)[None]
        hidden = decoder.decode(slots, embed, positions, cache, capture=capture)[0]
        found.append(capture.row_weights(0))
        position += 1
    if not found:
        return {}
    weights = torch.stack(found, dim=1).cpu().numpy()  # (heads, steps, text tokens)
    return {head: weights[i] for i, head in enumerate(capture.order)}
