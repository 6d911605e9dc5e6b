"""The official ChatTTS asset layout and its sha256 verification against ChatTTS's published map."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path

from ..config_model import ModelConfig
from .errors import ModelLoadError

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
    # Found, not imported: importing ChatTTS imports torch, seconds before --model can fail.
    spec = importlib.util.find_spec("ChatTTS")
    assert spec is not None and spec.origin is not None, "ChatTTS is not installed"
    text = (Path(spec.origin).parent / "res" / "sha256_map.json").read_text()
    return dict(json.loads(text))


def load_sha256_map(path: Path | None) -> dict[str, str]:
    """The map in ChatTTS's format at `path` (--sha256-map), or ChatTTS's own when None.
    Raises OSError or ValueError naming what is wrong with the file."""
    if path is None:
        return official_sha256_map()
    data = json.loads(path.expanduser().read_text())
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"{path} is not a JSON object of sha256 strings")
    return dict(data)


def config_sha256_map(config: ModelConfig) -> dict[str, str]:
    """The map the weights are checked against: --sha256-map, else ChatTTS's published one."""
    try:
        return load_sha256_map(config.sha256_map)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"--sha256-map {config.sha256_map}: {exc}") from None


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
    problems = (check_file(root, relpath, sha256_map) for relpath in OFFICIAL_FILES)
    return [problem for problem in problems if problem is not None]


def check_file(root: Path, relpath: str, sha256_map: Mapping[str, str]) -> str | None:
    """What is wrong with one official file under `root`, or None when it matches the map."""
    path = root / relpath
    expected = sha256_map.get(sha256_key(relpath))
    if not path.is_file():
        return f"missing {relpath}"
    if expected is None:
        return f"{relpath}: no sha256 in the map"
    if file_sha256(path) != expected:
        return f"{relpath}: sha256 mismatch"
    return None
