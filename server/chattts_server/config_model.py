"""The model section of the server configuration (`ModelConfig`: which weights, from where, on
which device and format) and where dev models are built; `config` holds the rest of the tree.
A leaf but for `defaults` and `config_fields`, like `config`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .config_fields import check as _check
from .config_fields import option
from .defaults import GGUF_FORMATS, MIN_SNR_DB

DEV_MODEL_CACHE = Path("~/.cache/chattts-stream/dev-models")
"""Where dev models are built unless told otherwise; `~` is expanded where it is used, so no
home directory is looked up at import."""


@dataclass(frozen=True)
class ModelConfig:
    model_dir: Path | None = option(
        None, "ChatTTS asset folder in the official layout", unset="none, serve the dev model"
    )
    model: str | None = option(
        None,
        "ChatTTS weights on the Hugging Face hub, REPO[@REVISION] (2Noise/ChatTTS: at the "
        "revision this release pins), fetched into the Hugging Face cache (HF_HOME), checked "
        "against the sha256 map, and read from the cache with no network once complete "
        "(HF_HUB_OFFLINE=1: never contact the hub)",
        unset="none, serve the dev model",
    )
    dev_model_fallback: bool = option(
        False,
        "where --model cannot be fetched (offline, hub unreachable, disk full), serve the dev "
        "model instead, saying why in one line (make run)",
    )
    hub_timeout_s: float = option(
        10.0,
        "how long --model waits for the hub to answer before calling it unreachable, in seconds",
        bounds=(0.1, 600),
    )
    sha256_map: Path | None = option(
        None,
        "JSON map of the weights' sha256 in ChatTTS's format (res/sha256_map.json), which "
        "--model-dir and --model files are checked against",
        unset="ChatTTS's published map",
    )
    # Set at start-up once --model's snapshot in the cache has passed the sha256 check, so the
    # model runner does not hash 1.2 GB a second time; never a flag.
    model_dir_checked: bool = field(default=False)
    dev_model: str = option(
        "tiny",
        "random-weight model served without --model-dir; its audio is noise",
        choices=("tiny", "full"),
    )
    dev_model_cache: Path = option(
        DEV_MODEL_CACHE, "where dev models are built once and reused (~ is expanded)"
    )
    allow_unverified: bool = option(
        False, "load model files that do not match ChatTTS's sha256 map"
    )
    device: str = option(
        "auto",
        "where the model runs; auto picks CUDA when available",
        choices=("auto", "cpu", "cuda"),
    )
    dtype: str = option(
        "auto",
        "GPT weight dtype on CUDA; auto = float16 (upstream's half path); a CPU serves "
        "llama.cpp's --gguf-format (torch fp32 where llama.cpp did not build)",
        choices=("auto", "float32", "float16", "bfloat16"),
    )
    gguf_format: str = option(
        "auto",
        "the GPT's weight format on CPU (llama.cpp); auto = the smallest format whose hidden "
        f"states on the loaded weights are within {MIN_SNR_DB:g} dB SNR of fp32, measured once "
        "per weights and kept in --gguf-cache-dir",
        choices=("auto", *GGUF_FORMATS),
    )
    gguf_cache_dir: Path | None = option(
        None,
        "where the GPT's GGUF file, its format's quality measure and the alignment heads are "
        "kept per weights (~ is expanded); a restart with the same weights reads them back",
        unset="gguf/ beside --dev-model-cache",
    )

    def check(self) -> None:
        _check(
            self.model is None or self.model_dir is None,
            "--model and --model-dir are two sources of weights: give one",
        )
        _check(
            self.model is None or _is_repo_spec(self.model),
            f"--model must be REPO[@REVISION] like 2Noise/ChatTTS, got {self.model!r}",
        )
        _check(
            self.model is not None or not self.dev_model_fallback,
            "--dev-model-fallback needs --model",
        )

    def gguf_folder(self) -> Path:
        """Where the GGUF files and the warm-up answers are written once and reused."""
        return (self.gguf_cache_dir or self.dev_model_cache.parent / "gguf").expanduser()

    threads: int = option(
        0,
        "torch intra-op threads; 0 = CPUs allowed by affinity and cgroup quota",
        bounds=(0, 1024),
    )
    adaptive_threads: bool = option(
        True,
        "on CPU, run fewer intra-op threads while a busy neighbour takes our CPUs, up to "
        "--threads again once they are idle",
        switch="on-off",
    )


def _is_repo_spec(spec: str) -> bool:
    repo_id, _, revision = spec.partition("@")
    owner, slash, name = repo_id.partition("/")
    return bool(owner and slash and name and "/" not in name) and "@" not in revision
