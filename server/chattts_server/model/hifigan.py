"""A HiFi-GAN V1 generator (Kong et al. 2020) in the official layout and parameter names,
behind the `Vocoder` protocol, for separately trained checkpoints.

What mel the HiFi-GAN path expects
----------------------------------
The Vocos features ChatTTS's Decoder was trained to produce: 100 mel bands of a 24 kHz signal,
n_fft 1024, win 1024 (Hann), hop 256, "center" framing, power 1 (magnitude, not power),
natural log of the magnitude clipped at 1e-5 (`vocos.feature_extractors.MelSpectrogramFeatures`:
``log(clip(mel(x), 1e-5))``, torchaudio mel scale "htk", no mel normalisation). A HiFi-GAN
trained on exactly these features (e.g. on `MelSpectrogramFeatures` of the training audio or on
the Decoder's own outputs) takes the Decoder's mel unchanged: the mapping is the identity. The
official HiFi-GAN recipes use a different mel (80 bands, 22.05 kHz, n_fft 1024, hop 256,
fmax 8 kHz, librosa slaney mel with slaney norm, log of magnitude clipped at 1e-5); such a model
needs its own training or a conversion: resynthesise to linear magnitude with the pseudo-inverse
of the Vocos filterbank (exp, then lstsq against torchaudio's htk filters), re-project onto the
target filterbank and log again, and resample the time axis if the hop in seconds differs.
Neither conversion is exact, so for ChatTTS train (or fine-tune) the HiFi-GAN on Vocos features.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..audio_constants import NUM_MELS, SAMPLE_RATE_HZ
from .receptive_field import ReceptiveField, chain_interval, conv_input_interval, field_of_interval
from .vocoders import (
    MelWindow,
    VocoderStreamInput,
    WindowAudio,
    decode_padded,
    module_device_dtype,
)

# Slope of the leaky ReLUs inside the generator; the last one (before conv_post) uses PyTorch's
# default 0.01 as in the official code, so official checkpoints reproduce.
LRELU_SLOPE = 0.1


@dataclass(frozen=True)
class HiFiGANConfig:
    """HiFi-GAN V1 generator hyper-parameters (official config_v1.json names)."""

    # Mel bands in; ChatTTS's Vocos features have 100.
    num_mels: int = NUM_MELS
    # Output sample rate (Hz); ChatTTS's Vocos features are of a 24 kHz signal.
    sample_rate: int = SAMPLE_RATE_HZ
    # Upsampling factor per stage; their product is the hop length (8*8*2*2 = 256).
    upsample_rates: tuple[int, ...] = (8, 8, 2, 2)
    # ConvTranspose1d kernel per stage (2x the rate).
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 4, 4)
    # Channels after conv_pre; halved by every upsampling stage.
    upsample_initial_channel: int = 512
    # Kernel of each multi-receptive-field (MRF) resblock.
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    # Dilations of each MRF resblock's three conv pairs.
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = field(
        default_factory=lambda: ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    )

    def __post_init__(self) -> None:
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise ValueError("upsample_rates and upsample_kernel_sizes differ in length")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("resblock_kernel_sizes and resblock_dilation_sizes differ in length")
        if any(k < u for u, k in zip(self.upsample_rates, self.upsample_kernel_sizes, strict=True)):
            raise ValueError("each upsample kernel must be at least its rate")
        if self.upsample_initial_channel % (2 ** len(self.upsample_rates)):
            raise ValueError("upsample_initial_channel must halve evenly at every stage")

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)


def _padding(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock1(nn.Module):
    """HiFi-GAN resblock type 1: three (dilated conv, conv) pairs, each with a residual add."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(
                channels, channels, kernel_size, 1, dilation=d, padding=_padding(kernel_size, d)
            )
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(
                channels, channels, kernel_size, 1, dilation=1, padding=_padding(kernel_size, 1)
            )
            for _ in dilations
        )

    def forward(self, x: Tensor) -> Tensor:
        for c1, c2 in zip(self.convs1, self.convs2, strict=True):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x

    def input_interval(self, lo: int, hi: int) -> tuple[int, int]:
        # Residual adds keep the identity path, which the conv path's interval contains.
        for c1, c2 in reversed(list(zip(self.convs1, self.convs2, strict=True))):
            lo, hi = chain_interval([c1, c2], lo, hi)
        return lo, hi


class HiFiGANGenerator(nn.Module):
    """HiFi-GAN V1 generator: mel (B, num_mels, n) -> audio (B, 1, n * hop) in [-1, 1].

    Plain convolutions (weight norm folded at load); parameter names match the official
    repository so its `generator` state dicts load directly.
    """

    def __init__(self, config: HiFiGANConfig = HiFiGANConfig()) -> None:
        super().__init__()
        self.config = config
        ch = config.upsample_initial_channel
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(config.num_mels, ch, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(ch // 2**i, ch // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(
                zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
            )
        )
        self.resblocks = nn.ModuleList(
            ResBlock1(ch // 2 ** (i + 1), k, d)
            for i in range(len(self.ups))
            for k, d in zip(
                config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True
            )
        )
        self.conv_post = nn.Conv1d(ch // 2 ** len(self.ups), 1, 7, 1, padding=3)

    def forward(self, mel: Tensor) -> Tensor:
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            xs = blocks[0](x)
            for block in blocks[1:]:
                xs = xs + block(x)
            x = xs / self.num_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))

    def receptive_field(self) -> ReceptiveField:
        """(left, right) mel frames that the hop samples of frame j depend on."""
        hop = self.config.hop_length
        lo, hi = 0, hop - 1  # sample block 0
        lo, hi = conv_input_interval(self.conv_post, lo, hi)
        for i in reversed(range(len(self.ups))):
            # MRF: the blocks run in parallel on the same input, so take the union.
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            spans = [cast(ResBlock1, block).input_interval(lo, hi) for block in blocks]
            lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
            lo, hi = conv_input_interval(self.ups[i], lo, hi)
        lo, hi = conv_input_interval(self.conv_pre, lo, hi)
        return field_of_interval(lo, hi, 0, 0)


def _fold_weight_norm(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Replace weight-norm pairs (weight_g/weight_v, or parametrizations original0/1) by weight."""
    out: dict[str, Tensor] = {}
    pairs: dict[str, dict[str, Tensor]] = {}
    for key, value in state_dict.items():
        for g_suffix, v_suffix in (
            (".weight_g", ".weight_v"),
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
        ):
            if key.endswith(g_suffix):
                pairs.setdefault(key.removesuffix(g_suffix), {})["g"] = value
                break
            if key.endswith(v_suffix):
                pairs.setdefault(key.removesuffix(v_suffix), {})["v"] = value
                break
        else:
            out[key] = value
    for prefix, pair in pairs.items():
        if set(pair) != {"g", "v"}:
            raise ValueError(f"incomplete weight-norm pair for {prefix}")
        g, v = pair["g"].float(), pair["v"].float()
        # torch weight_norm(dim=0): one norm per index of dim 0, over every other dim.
        norm = v.norm(dim=tuple(range(1, v.dim())), keepdim=True)
        out[prefix + ".weight"] = g * v / norm
    return out


class HiFiGANVocoder:
    """A HiFi-GAN V1 generator behind the `Vocoder` protocol (fp32, weight norm removed).

    It keeps no per-stream state: its transposed convolutions would need one per upsampling
    phase, so the streaming decoder gives it windows of mel frames (`decode_windows`).
    """

    def __init__(self, generator: HiFiGANGenerator) -> None:
        self.generator = generator.eval()
        config = generator.config
        self.sample_rate: int = config.sample_rate
        self.hop_length: int = config.hop_length
        self.n_mels: int = config.num_mels
        self.receptive_field: ReceptiveField = generator.receptive_field()
        self.end_trim_samples: int = 0

    @classmethod
    def from_checkpoint(
        cls,
        path: Path | str,
        config: HiFiGANConfig = HiFiGANConfig(),
        device: torch.device | str = "cpu",
    ) -> HiFiGANVocoder:
        """Load an official-layout checkpoint ({'generator': state_dict}) or a bare state dict.

        Weight-normed (weight_g/weight_v or parametrizations) and plain weights both load.
        """
        checkpoint = torch.load(str(path), map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, Mapping):
            raise ValueError(f"{path}: expected a state dict, got {type(checkpoint).__name__}")
        state_dict = checkpoint.get("generator", checkpoint)
        generator = HiFiGANGenerator(config)
        generator.load_state_dict(_fold_weight_norm(state_dict), strict=True)
        return cls(generator.to(device))

    def decode(self, mel: Tensor) -> Tensor:
        device, dtype = module_device_dtype(self.generator)
        return self.generator(mel.to(device=device, dtype=dtype)).squeeze(1)

    def decode_windows(self, windows: Sequence[MelWindow]) -> tuple[list[WindowAudio], int]:
        return decode_padded(self, windows)

    def open_stream_state(self) -> None:
        return None

    def stream(self, items: Sequence[VocoderStreamInput]) -> None:
        if items:
            raise ValueError("HiFi-GAN keeps no stream state: decode windows instead")
