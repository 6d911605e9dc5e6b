"""Load a ChatTTS model from its asset files: pick device and dtype, find (or build) the model
folder, verify it, and construct ChatTTS's modules sized to the files.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..config_model import ModelConfig
from .chattts_config import build_vocos, chattts_config
from .errors import ModelLoadError
from .shapes import ModelShapes, check_consistent, read_shapes
from .verify import config_sha256_map, resolve_model_dir, verify_assets

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda, but CUDA is not available")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The GPT's dtype on CUDA (fp16 unless told, as upstream ChatTTS's half path: norm
    statistics and heads stay fp32). On a CPU the weights load in fp32 whatever `name` says:
    llama.cpp converts them to its GGUF format, and torch's fallback is plain fp32."""
    if device.type != "cuda":
        return torch.float32
    if name == "auto":
        return torch.float16
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def verified_model_dir(config: ModelConfig) -> str:
    """`--model-dir`, its files checked against the sha256 map (ChatTTS's published one unless
    --sha256-map); a `--model` snapshot the start-up has checked already is not hashed again."""
    assert config.model_dir is not None
    try:
        root = resolve_model_dir(config.model_dir)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"--model-dir {config.model_dir}: {exc}") from None
    if config.model_dir_checked:
        return str(root)
    problems = verify_assets(root, config_sha256_map(config))
    if problems:
        listing = "; ".join(problems[:5])
        if not config.allow_unverified:
            raise ModelLoadError(
                f"--model-dir {root} does not match ChatTTS's published sha256 map ({listing}). "
                "Use official weights, or pass --allow-unverified to load them anyway."
            )
        log.warning("loading UNVERIFIED model files from %s: %s", root, listing)
    return str(root)


@dataclass
class ChatTTSModules:
    """The ChatTTS modules loaded from one asset folder, ready for inference (all eval)."""

    model_dir: Path
    shapes: ModelShapes
    embed: Any  # ChatTTS Embed: emb_text/emb_code and weight-normed heads, fp32
    gpt_config: Any  # transformers LlamaConfig from gpt/config.json
    # Llama weights ("layers.N...", "norm.weight") on the device, in the load dtype
    gpt_state_dict: dict[str, torch.Tensor]
    decoder: torch.nn.Module  # ChatTTS DVAE without encoder: hidden states -> log-mel, fp32
    # the full ChatTTS DVAE (mel encoder + FSQ) for reference-audio speakers, fp32
    dvae: torch.nn.Module
    vocos: torch.nn.Module  # vocos.Vocos: log-mel -> audio_constants.SAMPLE_RATE_HZ PCM, fp32
    tokenizer: Any  # ChatTTS.model.Tokenizer
    speaker: Any  # ChatTTS.model.Speaker sized to the GPT width
    normalizer: Any  # ChatTTS.norm.Normalizer with the package's homophones map


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


def _load_fp32_modules(
    asset: Path, shapes: ModelShapes, config: Any, device: torch.device
) -> tuple[Any, torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """Embed, Decoder, DVAE and Vocos from their files, fp32."""
    from ChatTTS.model import Embed
    from ChatTTS.utils import load_safetensors

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
    return embed, decoder, dvae, vocos


def load_chattts(model_dir: Path | str, device: torch.device, dtype: torch.dtype) -> ChatTTSModules:
    """Load every module from the asset files onto `device`.

    Only the GPT weights take `dtype`; Embed (embeddings and heads), Decoder, DVAE and Vocos
    stay fp32, as upstream keeps them (the heads run on fp32 hidden states, iSTFT needs fp32).
    """
    from ChatTTS.model import Speaker, Tokenizer
    from ChatTTS.norm import Normalizer
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
    embed, decoder, dvae, vocos = _load_fp32_modules(asset, shapes, config, device)
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
