"""Receptive fields of the non-causal convolution stacks that turn hidden states into audio:
which input frames one output frame (or block of samples) depends on, computed from the layers
themselves so the streaming decoder can cut a decode anywhere and know which samples are final.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from torch import nn

from ..audio_constants import FRAMES_PER_TOKEN as FRAMES_PER_TOKEN

# A receptive field: (left, right) input frames that one output frame (or sample block) needs.
ReceptiveField = tuple[int, int]

# Receptive-field arithmetic: walk layers backwards from an output interval to the input interval.


def conv_input_interval(layer: nn.Module, lo: int, hi: int) -> tuple[int, int]:
    """Input positions [lo', hi'] that outputs [lo, hi] of one convolution read."""
    if isinstance(layer, nn.ConvTranspose1d):
        (k,), (s,), (d,) = layer.kernel_size, layer.stride, layer.dilation
        p = int(layer.padding[0])
        # y[n] += x[i] * w[j] for n = i*s - p + d*j: contiguous because kernel >= stride here.
        return math.ceil((lo + p - d * (k - 1)) / s), (hi + p) // s
    if isinstance(layer, nn.Conv1d):
        (k,), (s,), (d,) = layer.kernel_size, layer.stride, layer.dilation
        p = layer.padding[0] if isinstance(layer.padding, tuple) else 0
        if layer.padding == "same":
            p = d * (k - 1) // 2
        return lo * s - p, hi * s - p + d * (k - 1)
    raise TypeError(f"not a 1-d convolution: {type(layer).__name__}")


def chain_interval(layers: Sequence[nn.Module], lo: int, hi: int) -> tuple[int, int]:
    for layer in reversed(layers):
        lo, hi = conv_input_interval(layer, lo, hi)
    return lo, hi


def field_of_interval(lo: int, hi: int, block_lo: int, block_hi: int) -> ReceptiveField:
    return block_lo - lo, hi - block_hi


def stride1_receptive_field(layers: Iterable[nn.Module]) -> ReceptiveField:
    """(left, right) of a chain of stride-1 convolutions, taken in forward order."""
    return field_of_interval(*chain_interval(list(layers), 0, 0), 0, 0)


def istft_receptive_field(
    n_fft: int, hop_length: int, win_length: int, padding: str
) -> ReceptiveField:
    """Frames whose windows overlap sample block j of an overlap-add iSTFT.

    "center" (torch.istft center=True) places frame k's window at samples
    [k*hop - n_fft/2, k*hop - n_fft/2 + win); "same" (vocos) trims (win - hop)/2 instead.
    """
    offset = n_fft // 2 if padding == "center" else (win_length - hop_length) // 2
    # frame k overlaps block 0 = [0, hop - 1] iff k*hop - offset <= hop - 1 and k*hop - offset + win - 1 >= 0
    first = math.ceil((offset - win_length + 1) / hop_length)
    last = (hop_length - 1 + offset) // hop_length
    return -first, last


def frames_to_tokens(field: ReceptiveField) -> ReceptiveField:
    """A mel-frame receptive field as GPT tokens (1 token = 2 frames), rounded outwards.

    Output frames 2t and 2t+1 (token t) read input frames 2t-left .. 2t+1+right, that is
    tokens t - ceil(left/2) .. t + ceil(right/2).
    """
    left, right = field
    return -(-left // FRAMES_PER_TOKEN), -(-right // FRAMES_PER_TOKEN)


def combined_receptive_field_tokens(
    decoder_rf: ReceptiveField, vocoder_rf: ReceptiveField
) -> ReceptiveField:
    """Tokens of left context and lookahead under which Decoder+vocoder output is exact."""
    return frames_to_tokens((decoder_rf[0] + vocoder_rf[0], decoder_rf[1] + vocoder_rf[1]))
