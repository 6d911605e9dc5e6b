"""docs/architecture.md stays true: every module its door-to-audio path names exists and
imports, the path has at most 20 files, and each layer it names is a package of the server."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
MAX_PATH_FILES = 20


def _path_files() -> list[str]:
    section = PAGE.read_text(encoding="utf-8").split("## One `StreamingSynthesize` request")[1]
    return re.findall(r"^\d+\. `(server/chattts_server/[\w/]+\.py)`", section, flags=re.M)


def test_the_door_to_audio_path_is_at_most_20_files_that_import() -> None:
    files = _path_files()
    assert 10 <= len(files) <= MAX_PATH_FILES, files
    assert len(set(files)) == len(files), "a file named twice"
    for file in files:
        assert (REPO / file).is_file(), file
        module = file.removeprefix("server/").removesuffix(".py").replace("/", ".")
        importlib.import_module(module)


def test_every_layer_the_page_names_is_a_package() -> None:
    table = PAGE.read_text(encoding="utf-8").split("## The layers")[1].split("##")[0]
    layers = re.findall(r"^\| `(\w+)/` \|", table, flags=re.M)
    assert {"api", "stream", "timing", "engine", "model", "text", "audio"} <= set(layers)
    for layer in layers:
        assert (REPO / "server" / "chattts_server" / layer / "__init__.py").is_file(), layer
