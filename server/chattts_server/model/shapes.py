"""Every size of a ChatTTS model, read from its asset files (safetensors headers and
gpt/config.json), never from ChatTTS's hard-coded config, so the official weights and the
random-weight dev assets (`devmodel/assets.py`, any size) are described the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from ..audio_constants import HOP_LENGTH, NUM_MELS, SAMPLE_RATE_HZ
from .verify import resolve_model_dir

# Not recorded in any weight file; these are ChatTTS's fixed values (the audio ones in
# audio_constants.py).
_DEFAULT_VQ_LEVELS = (5, 5, 5, 5)
_DEFAULT_VQ_RESIDUALS = 2


@dataclass(frozen=True)
class GptShapes:
    """The Llama backbone, from asset/gpt/config.json (checked against model.safetensors)."""

    num_layers: int  # transformer blocks
    hidden_size: int  # residual width; also the hidden state handed to the Decoder
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (equal to num_heads in ChatTTS)
    head_dim: int  # per-head width
    intermediate_size: int  # MLP width
    max_position_embeddings: int  # longest prompt + generation the model was trained for
    rope_theta: float  # RoPE base
    rms_norm_eps: float  # RMSNorm epsilon


@dataclass(frozen=True)
class EmbedShapes:
    """Token embeddings and output heads, from asset/Embed.safetensors."""

    hidden_size: int  # embedding width (equals the GPT width)
    num_text_tokens: int  # rows of emb_text / head_text (tokenizer length for the official model)
    num_audio_tokens: int  # codes per codebook, EOS included (EOS = num_audio_tokens - 1)
    num_vq: int  # codebooks predicted per GPT step


@dataclass(frozen=True)
class ConvStackShapes:
    """One ChatTTS DVAEDecoder: conv_in (idim->bn_dim->hidden), ConvNeXt blocks, conv_out."""

    idim: int  # input channels
    odim: int  # output channels
    hidden: int  # ConvNeXt width (blocks use 4 * hidden inside)
    n_layer: int  # ConvNeXt blocks (dilation 2 each, not stored in the file)
    bn_dim: int  # bottleneck channels of conv_in
    kernel: int  # depthwise kernel size of the blocks


@dataclass(frozen=True)
class DvaeShapes:
    """The full DVAE (mel encoder + grouped residual FSQ + decoder), from asset/DVAE.safetensors."""

    dim: int  # channels between downsample_conv / out_conv and the conv stacks
    encoder: ConvStackShapes
    decoder: ConvStackShapes
    vq_dim: int  # encoder output channels quantized by the FSQ
    vq_levels: tuple[int, ...]  # FSQ levels (only their count is in the file)
    vq_groups: int  # FSQ groups
    vq_residuals: int  # FSQ residual quantizers per group (not in the file: ChatTTS's value)


@dataclass(frozen=True)
class VocosShapes:
    """The Vocos vocoder, from asset/Vocos.safetensors."""

    dim: int  # backbone width
    intermediate_dim: int  # ConvNeXt MLP width
    num_layers: int  # ConvNeXt blocks
    n_mels: int  # mel bins in
    n_fft: int  # iSTFT size (from the head's window)
    hop_length: int  # samples per mel frame (not in the file: ChatTTS's value)
    sample_rate: int  # output sample rate (not in the file: ChatTTS's value)


@dataclass(frozen=True)
class ModelShapes:
    """All sizes of a ChatTTS model, read from its asset files."""

    gpt: GptShapes
    embed: EmbedShapes
    decoder: ConvStackShapes  # asset/Decoder.safetensors: GPT hidden states -> mel
    dvae: DvaeShapes
    vocos: VocosShapes

    @property
    def eos_token_id(self) -> int:
        """The audio code that ends generation in every codebook."""
        return self.embed.num_audio_tokens - 1


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    with safe_open(str(path), framework="pt") as f:
        return {key: list(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118


def _count_indexed(shapes: Mapping[str, list[int]], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(m.group(1)) for key in shapes if (m := pattern.match(key))}
    return max(indices) + 1 if indices else 0


def _conv_stack(shapes: Mapping[str, list[int]], prefix: str) -> ConvStackShapes:
    bn_dim, idim, _ = shapes[f"{prefix}.conv_in.0.weight"]
    hidden = shapes[f"{prefix}.conv_in.2.weight"][0]
    return ConvStackShapes(
        idim=idim,
        odim=shapes[f"{prefix}.conv_out.weight"][0],
        hidden=hidden,
        n_layer=_count_indexed(shapes, f"{prefix}.decoder_block."),
        bn_dim=bn_dim,
        kernel=shapes[f"{prefix}.decoder_block.0.dwconv.weight"][2],
    )


def _read_gpt(asset: Path) -> GptShapes:
    config = json.loads((asset / "gpt" / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    shapes = GptShapes(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config["intermediate_size"]),
        max_position_embeddings=int(config["max_position_embeddings"]),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
    )
    weights = {
        k.removeprefix("model."): v
        for k, v in _tensor_shapes(asset / "gpt" / "model.safetensors").items()
    }
    num_layers = _count_indexed(weights, "layers.")
    if num_layers != shapes.num_layers or weights["norm.weight"] != [hidden]:
        raise ValueError(
            f"gpt/model.safetensors ({num_layers} layers, norm {weights['norm.weight']}) "
            f"does not match gpt/config.json ({shapes.num_layers} layers, hidden {hidden})"
        )
    return shapes


def _read_vocos(path: Path) -> VocosShapes:
    shapes = _tensor_shapes(path)
    dim, n_mels, _ = shapes["backbone.embed.weight"]
    window = shapes.get("head.istft.window")
    return VocosShapes(
        dim=dim,
        intermediate_dim=shapes["backbone.convnext.0.pwconv1.weight"][0],
        num_layers=_count_indexed(shapes, "backbone.convnext."),
        n_mels=n_mels,
        n_fft=window[0] if window else shapes["head.out.weight"][0] - 2,
        hop_length=HOP_LENGTH,
        sample_rate=SAMPLE_RATE_HZ,
    )


def _read_dvae(path: Path) -> DvaeShapes:
    shapes = _tensor_shapes(path)
    codebook_dim, group_dim = shapes["vq_layer.quantizer.rvqs.0.project_in.weight"]
    groups = _count_indexed(shapes, "vq_layer.quantizer.rvqs.")
    levels = _DEFAULT_VQ_LEVELS
    if len(levels) != codebook_dim:
        raise ValueError(f"DVAE FSQ has {codebook_dim} levels; ChatTTS's config has {len(levels)}")
    return DvaeShapes(
        dim=shapes["out_conv.weight"][1],
        encoder=_conv_stack(shapes, "encoder"),
        decoder=_conv_stack(shapes, "decoder"),
        vq_dim=group_dim * groups,
        vq_levels=levels,
        vq_groups=groups,
        vq_residuals=_DEFAULT_VQ_RESIDUALS,
    )


def read_shapes(model_dir: Path | str) -> ModelShapes:
    """Read every size from the asset files (safetensors headers and gpt/config.json only)."""
    asset = resolve_model_dir(model_dir) / "asset"
    embed = _tensor_shapes(asset / "Embed.safetensors")
    num_text_tokens, hidden = embed["emb_text.weight"]
    return ModelShapes(
        gpt=_read_gpt(asset),
        embed=EmbedShapes(
            hidden_size=hidden,
            num_text_tokens=num_text_tokens,
            num_audio_tokens=embed["emb_code.0.weight"][0],
            num_vq=_count_indexed(embed, "emb_code."),
        ),
        decoder=_conv_stack(_tensor_shapes(asset / "Decoder.safetensors"), "decoder"),
        dvae=_read_dvae(asset / "DVAE.safetensors"),
        vocos=_read_vocos(asset / "Vocos.safetensors"),
    )


def check_consistent(shapes: ModelShapes) -> None:
    """Raise ValueError when the files cannot work together (ChatTTS would fail mid-inference)."""
    gpt, embed, dec = shapes.gpt, shapes.embed, shapes.decoder
    problems = []
    if embed.hidden_size != gpt.hidden_size:
        problems.append(f"Embed width {embed.hidden_size} != GPT width {gpt.hidden_size}")
    # The Decoder views a (B, H, T) hidden state as (B, 2, H/2, T): two mel frames per token.
    if 2 * dec.idim != gpt.hidden_size or dec.odim != dec.idim:
        problems.append(
            f"Decoder idim/odim {dec.idim}/{dec.odim} do not fit GPT width {gpt.hidden_size}"
        )
    if shapes.vocos.n_mels != NUM_MELS:
        problems.append(
            f"Vocos takes {shapes.vocos.n_mels} mels; ChatTTS's decoders give {NUM_MELS}"
        )
    if problems:
        raise ValueError("inconsistent ChatTTS assets: " + "; ".join(problems))
