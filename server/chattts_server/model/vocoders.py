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
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from .receptive_field import ReceptiveField


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


def num_samples(vocoder: Vocoder, num_frames: int) -> int:
    """Samples a decode of `num_frames` frames returns."""
    return max(0, num_frames * vocoder.hop_length - vocoder.end_trim_samples)


def module_device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(module.parameters())
    return param.device, param.dtype
