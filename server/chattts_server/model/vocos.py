"""Vocos, ChatTTS's vocoder (ConvNeXt backbone + iSTFT head), behind the `Vocoder` protocol."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .receptive_field import ReceptiveField, istft_receptive_field, stride1_receptive_field
from .vocoders import module_device_dtype


class VocosVocoder:
    """The ChatTTS Vocos module (`vocos.Vocos`) behind the `Vocoder` protocol."""

    def __init__(self, vocos: nn.Module) -> None:
        self.vocos = vocos
        # vocos.Vocos: VocosBackbone, ISTFTHead (untyped submodules)
        backbone: Any = vocos.backbone
        istft: Any = vocos.head.istft
        self.hop_length: int = istft.hop_length
        self.n_mels: int = backbone.input_channels
        self.sample_rate: int = 24000
        feature_extractor = getattr(vocos, "feature_extractor", None)
        mel_spec = getattr(feature_extractor, "mel_spec", None)
        if mel_spec is not None:
            self.sample_rate = int(mel_spec.sample_rate)
        # Per-frame ops (LayerNorm, MLP, the head's Linear) add nothing; the convolutions and the
        # iSTFT overlap do.
        convs = [backbone.embed] + [block.dwconv for block in backbone.convnext]
        b_left, b_right = stride1_receptive_field(convs)
        i_left, i_right = istft_receptive_field(
            istft.n_fft, istft.hop_length, istft.win_length, istft.padding
        )
        self.backbone_receptive_field: ReceptiveField = (b_left, b_right)
        self.receptive_field: ReceptiveField = (b_left + i_left, b_right + i_right)
        # torch.istft(center=True) returns (n - 1) * hop samples; vocos "same" returns n * hop.
        self.end_trim_samples: int = self.hop_length if istft.padding == "center" else 0

    def decode(self, mel: Tensor) -> Tensor:
        # vocos.Vocos.decode without its inference_mode decorator (callers choose the grad mode).
        device, dtype = module_device_dtype(self.vocos)
        vocos: Any = self.vocos
        return vocos.head(vocos.backbone(mel.to(device=device, dtype=dtype)))
