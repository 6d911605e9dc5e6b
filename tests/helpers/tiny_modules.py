"""Tiny random-weight ChatTTS Decoder, Vocos and HiFi-GAN with the official kernels, dilations
and layer counts (so their receptive fields are the real ones), and hidden-state inputs."""

from __future__ import annotations

import torch
from torch import nn

from chattts_server.model.hifigan import HiFiGANConfig, HiFiGANGenerator

HIDDEN = 128  # tiny GPT width; the Decoder reads it as two 64-channel frames
# Official kernels, rates and dilations; 16 channels (halved to 1 at full rate) to stay fast.
TINY_HIFIGAN = HiFiGANConfig(upsample_initial_channel=16)


def tiny_decoder(seed: int = 0) -> nn.Module:
    from ChatTTS.model import DVAE

    torch.manual_seed(seed)
    decoder = DVAE(
        decoder_config=dict(idim=HIDDEN // 2, odim=HIDDEN // 2, hidden=64, n_layer=12, bn_dim=32),
        dim=HIDDEN // 2,
    )
    # ChatTTS's layer-scale init (1e-6) would make the 12 blocks an identity.
    for block in decoder.decoder.decoder_block:
        block.weight.data.fill_(0.3)
    decoder.out_conv.weight.data.mul_(30.0)  # log-mel-like spread (std ~1.5) instead of ~0.05
    return decoder.eval()


def tiny_vocos(seed: int = 1) -> nn.Module:
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    torch.manual_seed(seed)
    return Vocos(
        feature_extractor=MelSpectrogramFeatures(),
        backbone=VocosBackbone(input_channels=100, dim=64, intermediate_dim=192, num_layers=8),
        head=ISTFTHead(dim=64, n_fft=1024, hop_length=256, padding="center"),
    ).eval()


def tiny_hifigan(seed: int = 2) -> HiFiGANGenerator:
    torch.manual_seed(seed)
    generator = HiFiGANGenerator(TINY_HIFIGAN)
    for module in generator.modules():
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
            nn.init.zeros_(module.bias)  # random biases saturate the tanh with a DC offset
    generator.conv_post.weight.data.mul_(100.0)  # a speech-like level (~0.1) instead of ~0.001
    return generator.eval()


def hidden_walk(num_tokens: int, seed: int = 3, width: int = HIDDEN) -> torch.Tensor:
    """(T, D) AR(1) hidden states: smooth like GPT states rather than white noise."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(num_tokens, width, generator=gen)
    out = torch.empty_like(noise)
    state = torch.zeros(width)
    for t in range(num_tokens):
        state = 0.9 * state + 0.45 * noise[t]
        out[t] = state
    return out
