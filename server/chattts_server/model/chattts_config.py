"""The adapter from our `ModelShapes` to upstream ChatTTS: its Config (module sections sized to the
files, speaker statistics sized to the GPT width) and the Vocos built from it.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pybase16384 as b14

from .shapes import ConvStackShapes, ModelShapes


def chattts_config(shapes: ModelShapes):  # -> ChatTTS.config.Config
    """An upstream ChatTTS Config whose module sections match `shapes` (spk_stat sized too).

    Builds fresh section objects: ChatTTS's Config shares its default section instances across
    all Config() objects, so mutating them in place would leak into every other Chat.
    """
    from ChatTTS.config import config as cc

    def stack(s: ConvStackShapes):
        return cc.Decoder(
            idim=s.idim, odim=s.odim, hidden=s.hidden, n_layer=s.n_layer, bn_dim=s.bn_dim
        )

    base = cc.Config()
    vocos = shapes.vocos
    gpt_section = cc.GPT(
        hidden_size=shapes.gpt.hidden_size,
        intermediate_size=shapes.gpt.intermediate_size,
        num_attention_heads=shapes.gpt.num_heads,
        num_hidden_layers=shapes.gpt.num_layers,
        max_position_embeddings=shapes.gpt.max_position_embeddings,
        num_audio_tokens=shapes.embed.num_audio_tokens,
        num_text_tokens=shapes.embed.num_text_tokens,
        num_vq=shapes.embed.num_vq,
    )
    return cc.Config(
        path=cc.Path(),
        decoder=stack(shapes.decoder),
        dvae=cc.DVAE(
            encoder=stack(shapes.dvae.encoder),
            decoder=stack(shapes.dvae.decoder),
            vq=cc.VQ(
                dim=shapes.dvae.vq_dim,
                levels=shapes.dvae.vq_levels,
                G=shapes.dvae.vq_groups,
                R=shapes.dvae.vq_residuals,
            ),
        ),
        gpt=gpt_section,
        embed=cc.Embed(
            hidden_size=shapes.embed.hidden_size,
            num_audio_tokens=shapes.embed.num_audio_tokens,
            num_text_tokens=shapes.embed.num_text_tokens,
            num_vq=shapes.embed.num_vq,
        ),
        vocos=cc.Vocos(
            feature_extractor=cc.FeatureExtractor(
                init_args=replace(
                    base.vocos.feature_extractor.init_args,
                    sample_rate=vocos.sample_rate,
                    n_fft=vocos.n_fft,
                    hop_length=vocos.hop_length,
                    n_mels=vocos.n_mels,
                )
            ),
            backbone=cc.Backbone(
                init_args=cc.BackboneInitArgs(
                    input_channels=vocos.n_mels,
                    dim=vocos.dim,
                    intermediate_dim=vocos.intermediate_dim,
                    num_layers=vocos.num_layers,
                )
            ),
            head=cc.FourierHead(
                init_args=cc.FourierHeadInitArgs(
                    dim=vocos.dim, n_fft=vocos.n_fft, hop_length=vocos.hop_length
                )
            ),
        ),
        spk_stat=speaker_stat(shapes.gpt.hidden_size),
    )


def speaker_stat(hidden_size: int) -> str:
    """ChatTTS's speaker std/mean (base16384 fp16), sized for `hidden_size`.

    The published statistics are 768-wide (the official GPT width). For other widths (tiny dev
    models) we cycle through them: deterministic, and each entry keeps a realistic std/mean.
    """
    from ChatTTS.config import Config

    official = Config().spk_stat
    stat = np.frombuffer(b14.decode_from_string(official), dtype=np.float16)
    std, mean = np.split(stat, 2)
    if std.size == hidden_size:
        return official
    index = np.arange(hidden_size) % std.size
    return b14.encode_to_string(
        np.concatenate([std[index], mean[index]]).astype(np.float16).tobytes()
    )


def build_vocos(config):  # -> vocos.Vocos
    """A Vocos with random weights, built from a ChatTTS Config's vocos section."""
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    # Same construction as ChatTTS's Chat._load.
    return Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(config.vocos.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
        head=instantiate_class(args=(), init=asdict(config.vocos.head)),
    )
