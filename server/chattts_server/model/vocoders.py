"""The vocoder protocol (log-mel -> 24 kHz PCM) and the bookkeeping every vocoder shares.

Two stages turn GPT hidden states into audio, both non-causal convolution stacks:

- the ChatTTS Decoder (a DVAE without encoder): hidden states (B, 2*idim, T tokens) are read as
  two mel-rate frames per token, then conv_in, 12 ConvNeXt blocks and out_conv give a log-mel
  (B, 100, 2T) (`mel_decoder.py`).
- a vocoder behind the `Vocoder` protocol: `VocosVocoder` (`vocos.py`, the ChatTTS Vocos
  module) or `HiFiGANVocoder` (`hifigan.py`, our HiFi-GAN V1 generator, for separately trained
  checkpoints).

Sample/frame bookkeeping shared by every vocoder: a decode of n frames returns
``n * hop_length - end_trim_samples`` samples, and samples ``[j * hop, (j + 1) * hop)`` are
"block j", determined by frames ``j - left .. j + right`` of the same decode, where
``(left, right) = receptive_field`` (`receptive_field.py`). Both numbers are computed from the
module's layers, so the chunker can cut a decode anywhere and know exactly which samples are final.

The streaming decoder speaks to a vocoder in two ways, both batched over streams:
- with per-stream state (`open_stream_state`, then `stream`), where the vocoder can keep one
  (Vocos): each call folds in a stream's new final mel frames and returns the samples they make
  final, so no frame is decoded twice;
- by windows (`decode_windows`): a span of mel frames decoded on its own, of which the caller
  keeps the samples in the middle. Every vocoder can; `decode_padded` is the plain way, through
  `decode`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor, nn

from .receptive_field import ReceptiveField


class VocoderStreamState(Protocol):
    """One stream's state inside a vocoder that keeps state between chunks; only the vocoder
    that opened it reads it."""


@dataclass
class VocoderStreamInput:
    """One stream's share of a `Vocoder.stream` call."""

    state: VocoderStreamState  # from `open_stream_state` of the same vocoder
    mel: Tensor  # (n, n_mels) new final mel frames, (T, C) layout
    flush: bool  # also emit what the held-back frames give with right zero padding
    audio: Tensor | None = None  # out: samples final for good, following the previous call's
    provisional: Tensor | None = None  # out: flush samples after `audio` (not kept)


@dataclass(frozen=True)
class MelWindow:
    """A span of one stream's mel frames to decode on its own, and the samples kept from it."""

    mel: Tensor  # (frames, n_mels), (T, C) layout: the stream's frames from `first_frame` on
    first_frame: int
    first_sample: int  # the stream's first sample the caller keeps
    end_sample: int  # one past the last sample the caller keeps


# A window's samples (float32, on the CPU) and the stream's index of its first sample.
WindowAudio = tuple[Tensor, int]


@runtime_checkable
class Vocoder(Protocol):
    """log-mel (B, n_mels, n) -> PCM (B, n * hop_length - end_trim_samples), float in [-1, 1]."""

    sample_rate: int  # Hz of the PCM it returns
    hop_length: int  # samples per mel frame
    n_mels: int  # mel bands it reads
    receptive_field: ReceptiveField  # (left, right) frames that samples of frame j depend on
    end_trim_samples: int  # samples fewer than n * hop_length that a decode of n frames returns

    def decode(self, mel: Tensor) -> Tensor:
        """Decode (B, n_mels, n) on the vocoder's device; returns (B, num_samples(n))."""
        ...

    def decode_windows(self, windows: Sequence[MelWindow]) -> tuple[list[WindowAudio], int]:
        """Each window's samples, covering at least its kept span, and the number of forward
        passes that took (windows are batched)."""
        ...

    def open_stream_state(self) -> VocoderStreamState | None:
        """A new stream's state before its first frame, or None if this vocoder keeps none (the
        caller then decodes windows)."""
        ...

    def stream(self, items: Sequence[VocoderStreamInput]) -> None:
        """Advance every item's state by its new frames in one pass; fills `audio` (and, at a
        flush, `provisional`). Concatenated `audio` of all calls, then the last flush's
        `provisional`, equals `decode` of all frames (float rounding aside)."""
        ...


def num_samples(vocoder: Vocoder, num_frames: int) -> int:
    """Samples a decode of `num_frames` frames returns."""
    return max(0, num_frames * vocoder.hop_length - vocoder.end_trim_samples)


def right_frames_needed(vocoder: Vocoder) -> int:
    """Frames a decode must reach past sample block j for the block to be final: the receptive
    field's right side, or more where the decode's end trim drops the last samples."""
    return max(vocoder.receptive_field[1], -(-vocoder.end_trim_samples // vocoder.hop_length))


def module_device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(module.parameters())
    return param.device, param.dtype


_T = TypeVar("_T")


def length_groups(
    items: Sequence[_T], length: Callable[[_T], int], right_safe: Callable[[_T], bool]
) -> list[tuple[int, list[_T]]]:
    """Batches of windows for a padded call: the longest length takes every right-safe item
    (right zero padding cannot reach its kept outputs); the rest group by exact length."""
    groups: list[tuple[int, list[_T]]] = []
    pending = sorted(items, key=length, reverse=True)
    while pending:
        size = length(pending[0])
        groups.append((size, [i for i in pending if length(i) == size or right_safe(i)]))
        pending = [i for i in pending if not (length(i) == size or right_safe(i))]
    return groups


def decode_padded(vocoder: Vocoder, windows: Sequence[MelWindow]) -> tuple[list[WindowAudio], int]:
    """`Vocoder.decode_windows` through `decode`: windows zero-padded on the right to a common
    length where the padding cannot reach the samples kept, the others grouped by exact length
    (one call per group; in steady state every stream's window has the same length)."""
    hop, right = vocoder.hop_length, right_frames_needed(vocoder)

    def right_safe(i: int) -> bool:
        window = windows[i]
        return -(-window.end_sample // hop) + right <= window.first_frame + len(window.mel)

    out: dict[int, WindowAudio] = {}
    groups = length_groups(range(len(windows)), lambda i: len(windows[i].mel), right_safe)
    for length, group in groups:
        first = windows[group[0]].mel
        mel = first.new_zeros((len(group), first.shape[1], length))  # (B, n_mels, frames)
        for row, i in enumerate(group):
            mel[row, :, : len(windows[i].mel)] = windows[i].mel.T
        audio = vocoder.decode(mel).float().cpu()  # (B, samples)
        for row, i in enumerate(group):
            window = windows[i]
            samples = audio[row, : num_samples(vocoder, len(window.mel))]
            out[i] = (samples, window.first_frame * hop)
    return [out[i] for i in range(len(windows))], len(groups)
