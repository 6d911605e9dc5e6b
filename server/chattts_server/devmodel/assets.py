"""Random-weight ChatTTS assets in the official layout, for tests ("tiny") and benchmarks ("full").

Built from ChatTTS's own module classes with fixed seeds, cached per variant, and published with
one directory rename so a crashed build is never reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from ..audio_constants import HOP_LENGTH, NUM_MELS, SAMPLE_RATE_HZ
from ..config_model import DEV_MODEL_CACHE
from ..model.chattts_config import build_vocos, chattts_config
from ..model.shapes import (
    ConvStackShapes,
    DvaeShapes,
    EmbedShapes,
    GptShapes,
    ModelShapes,
    VocosShapes,
)
from ..model.verify import OFFICIAL_FILES
from .tokenizer import OFFICIAL_VOCAB_SIZE, build_tokenizer

if TYPE_CHECKING:
    from ChatTTS.model import DVAE

VARIANTS = ("tiny", "full")
# Bump when the recipe changes: cached builds with another stamp are rebuilt.
RECIPE_VERSION = 2
STAMP_FILE = "dev-assets.json"
_SEED = 20240528


def default_dev_cache_dir() -> Path:
    """Where dev assets are cached unless told otherwise (config_model.DEV_MODEL_CACHE, expanded)."""
    return DEV_MODEL_CACHE.expanduser()


def _stack(idim: int, odim: int, hidden: int, bn_dim: int) -> ConvStackShapes:
    # 12 blocks, kernel 7 (dilation 2): the official receptive field at every size.
    return ConvStackShapes(idim=idim, odim=odim, hidden=hidden, n_layer=12, bn_dim=bn_dim, kernel=7)


def variant_shapes(variant: str, num_text_tokens: int) -> ModelShapes:
    """The shapes a dev variant is built with (read_shapes on the build returns exactly these)."""
    if variant == "full":
        gpt = GptShapes(20, 768, 12, 12, 64, 3072, 4096, 10000.0, 1e-6)
        decoder = _stack(384, 384, 512, 128)
        dvae = DvaeShapes(
            512, _stack(512, 1024, 256, 128), _stack(512, 512, 256, 128), 1024, (5, 5, 5, 5), 2, 2
        )
        vocos = VocosShapes(512, 1536, 8, NUM_MELS, 1024, HOP_LENGTH, SAMPLE_RATE_HZ)
    elif variant == "tiny":
        gpt = GptShapes(2, 128, 4, 4, 32, 256, 4096, 10000.0, 1e-6)
        # Decoder idim is half the GPT width: it reads each hidden state as two mel frames.
        decoder = _stack(64, 64, 64, 32)
        dvae = DvaeShapes(
            64, _stack(64, 128, 64, 32), _stack(64, 64, 64, 32), 128, (5, 5, 5, 5), 2, 2
        )
        vocos = VocosShapes(64, 192, 8, NUM_MELS, 1024, HOP_LENGTH, SAMPLE_RATE_HZ)
    else:
        raise ValueError(f"unknown dev asset variant {variant!r}; choose from {VARIANTS}")
    # 626 audio codes = 5**4 FSQ codes + EOS (625), as upstream.
    embed = EmbedShapes(gpt.hidden_size, num_text_tokens, 626, 4)
    return ModelShapes(gpt=gpt, embed=embed, decoder=decoder, dvae=dvae, vocos=vocos)


def _stamp(variant: str) -> dict[str, object]:
    return {"variant": variant, "recipe": RECIPE_VERSION, "seed": _SEED}


def _is_complete(model_dir: Path, variant: str) -> bool:
    try:
        stamp = json.loads((model_dir / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return stamp == _stamp(variant) and all((model_dir / f).is_file() for f in OFFICIAL_FILES)


def build_dev_assets(variant: str, cache_dir: Path | str | None = None) -> Path:
    """Build (or reuse) random-weight assets; returns the model dir (the folder holding asset/).

    `cache_dir` defaults to `default_dev_cache_dir()`; the model dir is `cache_dir/variant`.
    A complete build is reused as is; an incomplete or stale one is replaced. Builders take
    turns (a lock file beside the model): a second one waits, then reuses the first's build, so
    a complete build is never moved away from under a server reading it (a fresh clone's test
    workers all build at once).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown dev asset variant {variant!r}; choose from {VARIANTS}")
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_dev_cache_dir()
    target = cache_dir / variant
    if _is_complete(target, variant):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{variant}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(target, variant):  # built while this one waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{variant}.building-", dir=cache_dir))
        try:
            _write_assets(staging, variant)
            (staging / STAMP_FILE).write_text(json.dumps(_stamp(variant), indent=2) + "\n")
            _make_readable(staging)
            _publish(staging, target, variant)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _make_readable(root: Path) -> None:
    # mkdtemp makes the folder 0700 and safetensors writes 0600; a shared cache needs 0755/0644.
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _publish(staging: Path, target: Path, variant: str) -> None:
    """Move the finished build into place with renames only (no half-written target)."""
    if target.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{variant}.stale-", dir=target.parent))
        with contextlib.suppress(FileNotFoundError):  # another builder moved it first
            os.replace(target, stale / variant)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        # Another process published meanwhile; keep theirs if it is complete.
        if not _is_complete(target, variant):
            raise


def _set_layer_scales(module: torch.nn.Module, value: float) -> None:
    # ChatTTS's ConvNeXt blocks start at layer scale 1e-6, which would make 12 random blocks an
    # identity and hide the receptive field from streaming tests. At 1.0 a change to one token
    # still moves mel frames 30 away by 1e-3 of the peak effect (trained weights reach further).
    from ChatTTS.model.dvae import ConvNeXtBlock

    for block in module.modules():
        if isinstance(block, ConvNeXtBlock) and block.weight is not None:
            block.weight.data.fill_(value)


# Real ChatTTS log-mels spread over several units; random weights give ~0.1. Vocos normalises
# its input, but mel-domain tolerances and vocoders without input norm need a realistic spread.
_MEL_STD = 1.5


@torch.no_grad()
def _calibrate_mel_spread(decoder: DVAE, hidden_size: int) -> None:
    """Scale out_conv so unit-RMS hidden states (as the GPT's final norm gives) map to ~_MEL_STD."""
    probe = torch.randn(1, hidden_size, 256, generator=torch.Generator().manual_seed(_SEED))
    mel = decoder(probe)
    decoder.out_conv.weight.mul_(_MEL_STD / float(mel.std()))


def _save(state_dict: dict[str, torch.Tensor], path: Path, **metadata: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in state_dict.items()}
    save_file(tensors, str(path), metadata=metadata or None)


def _write_assets(model_dir: Path, variant: str) -> None:
    """Every weight file of the official layout, each part from its own seed (so a part's
    weights do not depend on the parts before it)."""
    asset = model_dir / "asset"
    num_text_tokens = build_tokenizer(
        asset / "tokenizer", OFFICIAL_VOCAB_SIZE if variant == "full" else None
    )
    shapes = variant_shapes(variant, num_text_tokens)
    config = chattts_config(shapes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        _write_gpt(asset, shapes.gpt)
        torch.manual_seed(_SEED + 1)
        _write_embed(asset, shapes)
        # seeds _SEED + 2 (DVAE) and _SEED + 3 (Decoder)
        _write_dvae_and_decoder(asset, config, shapes)
        torch.manual_seed(_SEED + 4)
        vocos = build_vocos(config)  # Vocos's own init (trunc normal 0.02, layer scale 1/L)
        _save(vocos.state_dict(), asset / "Vocos.safetensors")


def _gpt_config_json(gpt: GptShapes) -> dict[str, Any]:
    """asset/gpt/config.json: a transformers LlamaConfig at the GPT's shapes."""
    # fmt: off
    return {
        "architectures": ["LlamaModel"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "head_dim": gpt.head_dim, "hidden_act": "silu",
        "hidden_size": gpt.hidden_size, "initializer_range": 0.02,
        "intermediate_size": gpt.intermediate_size,
        "max_position_embeddings": gpt.max_position_embeddings, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": gpt.num_heads,
        "num_hidden_layers": gpt.num_layers, "num_key_value_heads": gpt.num_kv_heads,
        "pretraining_tp": 1, "rms_norm_eps": gpt.rms_norm_eps, "rope_scaling": None,
        "rope_theta": gpt.rope_theta, "tie_word_embeddings": False, "torch_dtype": "float32",
        "use_cache": False,
        # Upstream feeds inputs_embeds and deletes embed_tokens after loading, so the
        # vocabulary here is never used; keep Llama's default rather than a real size.
        "vocab_size": 32000,
    }
    # fmt: on


def _write_gpt(asset: Path, gpt: GptShapes) -> None:
    from transformers import LlamaConfig, LlamaModel

    gpt_json = _gpt_config_json(gpt)
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    (asset / "gpt" / "config.json").write_text(json.dumps(gpt_json, indent=2) + "\n")
    llama = LlamaModel(LlamaConfig(**gpt_json))  # HF init: normal(0, 0.02), norms at 1
    llama_state = {k: v for k, v in llama.state_dict().items() if not k.startswith("embed_tokens.")}
    _save(llama_state, asset / "gpt" / "model.safetensors", format="pt")


def _write_embed(asset: Path, shapes: ModelShapes) -> None:
    from ChatTTS.model import Embed

    embed = Embed(
        shapes.embed.hidden_size,
        shapes.embed.num_audio_tokens,
        shapes.embed.num_text_tokens,
        shapes.embed.num_vq,
    )
    # HF-style embedding scale, comparable to the unit-norm speaker vector Speaker.apply
    # writes at [spk_emb]; the weight-normed heads keep their default init.
    for emb in [embed.emb_text, *embed.emb_code]:
        torch.nn.init.normal_(emb.weight, std=0.02)
    _save(embed.state_dict(), asset / "Embed.safetensors")


def _write_dvae_and_decoder(asset: Path, config: Any, shapes: ModelShapes) -> None:
    """The DVAE (seed _SEED + 2) and the Decoder (_SEED + 3), which shares the DVAE's coef as
    upstream's Chat._load passes it on."""
    from ChatTTS.model import DVAE

    cpu = torch.device("cpu")
    torch.manual_seed(_SEED + 2)
    dvae = DVAE(
        decoder_config=asdict(config.dvae.decoder),
        encoder_config=asdict(config.dvae.encoder),
        vq_config=asdict(config.dvae.vq),
        dim=config.dvae.decoder.idim,
        device=cpu,
    )  # coef: 100 uniform floats drawn from the seeded generator
    _set_layer_scales(dvae, 1.0)
    _save(dvae.state_dict(), asset / "DVAE.safetensors")

    torch.manual_seed(_SEED + 3)
    decoder = DVAE(
        decoder_config=asdict(config.decoder),
        dim=config.decoder.idim,
        coef=str(dvae),
        device=cpu,
    )
    _set_layer_scales(decoder, 1.0)
    _calibrate_mel_spread(decoder, shapes.gpt.hidden_size)
    _save(decoder.state_dict(), asset / "Decoder.safetensors")
