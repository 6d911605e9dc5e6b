"""ChatTTS assets in the official layout: verify, read their shapes, load the modules.

Everything here is driven by the files, never by ChatTTS's hard-coded config, so the official
weights and the random-weight dev assets (`dev_assets.py`, any size) load the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pybase16384 as b14
import torch
from safetensors import safe_open
from safetensors.torch import load_file

# The official asset files, relative to the model dir (the folder that holds `asset/`).
OFFICIAL_FILES: tuple[str, ...] = (
    "asset/Decoder.safetensors",
    "asset/DVAE.safetensors",
    "asset/Embed.safetensors",
    "asset/Vocos.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/special_tokens_map.json",
    "asset/tokenizer/tokenizer_config.json",
    "asset/tokenizer/tokenizer.json",
)

# Not recorded in any weight file; these are ChatTTS's fixed values.
_DEFAULT_VQ_LEVELS = (5, 5, 5, 5)
_DEFAULT_VQ_RESIDUALS = 2
_DEFAULT_HOP_LENGTH = 256
_SAMPLE_RATE = 24000


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


def build_dev_assets(variant: str, cache_dir: Path | str | None = None) -> Path:
    """Build or reuse random-weight assets; see `dev_assets.build_dev_assets`."""
    from .dev_assets import build_dev_assets as build

    return build(variant, cache_dir)


def resolve_model_dir(path: Path | str) -> Path:
    """The folder holding `asset/`, given either that folder or the `asset/` folder itself."""
    path = Path(path).expanduser()
    if (path / "asset").is_dir():
        return path
    if path.name == "asset" and path.is_dir():
        return path.parent
    raise FileNotFoundError(f"{path} holds no ChatTTS asset/ folder")


def official_sha256_map() -> dict[str, str]:
    """ChatTTS's published sha256 map (keys like `sha256_asset_gpt_config_json`)."""
    text = resources.files("ChatTTS").joinpath("res", "sha256_map.json").read_text()
    return dict(json.loads(text))


def sha256_key(relpath: str) -> str:
    """The sha256 map key ChatTTS uses for an asset path: asset/gpt/config.json -> sha256_asset_gpt_config_json."""
    return "sha256_" + relpath.replace("/", "_").replace(".", "_")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_assets(model_dir: Path | str, sha256_map: Mapping[str, str] | None = None) -> list[str]:
    """Check every official file against the sha256 map (ChatTTS's own unless given).

    Returns one human-readable problem per bad file; an empty list means all files match.
    """
    sha256_map = official_sha256_map() if sha256_map is None else sha256_map
    try:
        root = resolve_model_dir(model_dir)
    except FileNotFoundError:
        return [f"missing {relpath}" for relpath in OFFICIAL_FILES]
    problems = []
    for relpath in OFFICIAL_FILES:
        path = root / relpath
        expected = sha256_map.get(sha256_key(relpath))
        if not path.is_file():
            problems.append(f"missing {relpath}")
        elif expected is None:
            problems.append(f"{relpath}: no sha256 in the map")
        elif file_sha256(path) != expected:
            problems.append(f"{relpath}: sha256 mismatch")
    return problems


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
        hop_length=_DEFAULT_HOP_LENGTH,
        sample_rate=_SAMPLE_RATE,
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
    if shapes.vocos.n_mels != 100:
        problems.append(f"Vocos takes {shapes.vocos.n_mels} mels; ChatTTS's decoders give 100")
    if problems:
        raise ValueError("inconsistent ChatTTS assets: " + "; ".join(problems))


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


@dataclass
class ChatTTSModules:
    """The ChatTTS modules loaded from one asset folder, ready for inference (all eval)."""

    model_dir: Path
    shapes: ModelShapes
    embed: Any  # ChatTTS Embed: emb_text/emb_code and weight-normed heads, fp32
    gpt_config: Any  # transformers LlamaConfig from gpt/config.json
    gpt_state_dict: dict[
        str, torch.Tensor
    ]  # Llama weights ("layers.N...", "norm.weight"), device/dtype
    decoder: torch.nn.Module  # ChatTTS DVAE without encoder: hidden states -> log-mel, fp32
    dvae: (
        torch.nn.Module
    )  # full ChatTTS DVAE (mel encoder + FSQ) for reference-audio speakers, fp32
    vocos: torch.nn.Module  # vocos.Vocos: log-mel -> 24 kHz audio, fp32
    tokenizer: Any  # ChatTTS.model.Tokenizer
    speaker: Any  # ChatTTS.model.Speaker sized to the GPT width
    normalizer: Any  # ChatTTS.norm.Normalizer with the package's homophones map


def build_vocos(config):  # -> vocos.Vocos
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    # Same construction as ChatTTS's Chat._load.
    return Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(config.vocos.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
        head=instantiate_class(args=(), init=asdict(config.vocos.head)),
    )


def _new_dvae(config, device: torch.device, with_encoder: bool):
    from ChatTTS.model import DVAE

    if with_encoder:
        return DVAE(
            decoder_config=asdict(config.dvae.decoder),
            encoder_config=asdict(config.dvae.encoder),
            vq_config=asdict(config.dvae.vq),
            dim=config.dvae.decoder.idim,
            device=device,
        )
    return DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim, device=device)


def load_chattts(model_dir: Path | str, device: torch.device, dtype: torch.dtype) -> ChatTTSModules:
    """Load every module from the asset files onto `device`.

    Only the GPT weights take `dtype`; Embed (embeddings and heads), Decoder, DVAE and Vocos
    stay fp32, as upstream keeps them (the heads run on fp32 hidden states, iSTFT needs fp32).
    """
    from ChatTTS.model import Embed, Speaker, Tokenizer
    from ChatTTS.norm import Normalizer
    from ChatTTS.utils import load_safetensors
    from transformers import LlamaConfig

    root = resolve_model_dir(model_dir)
    asset = root / "asset"
    shapes = read_shapes(root)
    check_consistent(shapes)
    config = chattts_config(shapes)

    tokenizer = Tokenizer(str(asset / "tokenizer"))
    if tokenizer.len > shapes.embed.num_text_tokens:
        raise ValueError(
            f"tokenizer has {tokenizer.len} tokens; Embed has {shapes.embed.num_text_tokens}"
        )

    gpt_state_dict = {
        key.removeprefix("model."): tensor.to(dtype=dtype)
        for key, tensor in load_file(
            str(asset / "gpt" / "model.safetensors"), device=str(device)
        ).items()
        if not key.removeprefix("model.").startswith("embed_tokens.")
    }

    # Module constructors draw random init (and DVAE a random coef) that the files overwrite;
    # keep those draws off the caller's generator so loading does not shift seeded sampling.
    with torch.random.fork_rng(devices=[]):
        embed = Embed(
            shapes.embed.hidden_size,
            shapes.embed.num_audio_tokens,
            shapes.embed.num_text_tokens,
            shapes.embed.num_vq,
        )
        embed.load_pretrained(str(asset / "Embed.safetensors"), device=device)

        decoder = _new_dvae(config, device, with_encoder=False)
        decoder.load_pretrained(str(asset / "Decoder.safetensors"), device)
        dvae = _new_dvae(config, device, with_encoder=True)
        dvae.load_pretrained(str(asset / "DVAE.safetensors"), device)

        vocos = build_vocos(config)
        vocos.load_state_dict(load_safetensors(str(asset / "Vocos.safetensors")))

    homophones = resources.files("ChatTTS").joinpath("res", "homophones_map.json")
    return ChatTTSModules(
        model_dir=root,
        shapes=shapes,
        embed=embed.eval(),
        gpt_config=LlamaConfig.from_json_file(str(asset / "gpt" / "config.json")),
        gpt_state_dict=gpt_state_dict,
        decoder=decoder.eval(),
        dvae=dvae.eval(),
        vocos=vocos.to(device).eval(),
        tokenizer=tokenizer,
        speaker=Speaker(shapes.gpt.hidden_size, config.spk_stat, device),
        normalizer=Normalizer(str(homophones), logging.getLogger("chattts_server.normalizer")),
    )


def upstream_chat(model_dir: Path | str, device: torch.device | None = None):  # -> ChatTTS.Chat
    """An upstream ChatTTS Chat loaded from these files (any size), for parity tests and benchmarks."""
    from ChatTTS import Chat

    root = resolve_model_dir(model_dir)
    shapes = read_shapes(root)
    check_consistent(shapes)
    chat = Chat(logging.getLogger("chattts_server.upstream"))
    chat.config = chattts_config(shapes)
    paths = {name: str(root / rel) for name, rel in asdict(chat.config.path).items()}
    if not chat._load(device=device or torch.device("cpu"), compile=False, **paths):
        raise RuntimeError(f"ChatTTS could not load {root}")
    return chat
