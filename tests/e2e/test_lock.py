"""The lock (uv.lock) agrees with pyproject.toml, with the venv `make install` built, and with
the GPU wheel list; a pyproject edited without `make lock` is refused, not quietly resolved."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".cache" / "uv-tool" / "bin" / "uv"
EXTRAS = ["--extra", "server", "--extra", "dev"]

pytestmark = pytest.mark.skipif(not UV.exists(), reason="no .cache/uv-tool (make install makes it)")


def _uv(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {"UV_CACHE_DIR": str(REPO / ".cache" / "uv"), "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run(
        [str(UV), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_lock_is_what_pyproject_resolves_to() -> None:
    done = _uv("lock", "--check")
    assert done.returncode == 0, done.stderr


def test_the_venv_holds_exactly_the_lock() -> None:
    import importlib.util

    # llama-cpp-python builds from source in `make install`, which leaves it out if it fails.
    built = importlib.util.find_spec("llama_cpp") is not None
    extras = [*EXTRAS]
    if built:  # with the build settings make install used, or uv would build it again
        settings = subprocess.run(
            ["make", "-s", "llama-build-args"], cwd=REPO, capture_output=True, text=True
        ).stdout
        extras += ["--extra", "llamacpp", *shlex.split(settings)]
    done = _uv("sync", "--locked", "--check", *extras, "--python", sys.executable)
    assert done.returncode == 0, done.stderr
    # What a second `make install` asks for (the interpreter it resolves) keeps this venv.
    python = subprocess.run(
        ["make", "-s", "install-python"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    again = _uv("sync", "--locked", "--dry-run", *extras, "--python", python)
    assert again.returncode == 0 and "Would make no changes" in again.stderr, again.stderr
    import importlib.metadata as md

    assert md.version("torch").split("+")[0] == "2.9.1"


def test_a_pyproject_edited_without_relocking_is_refused(tmp_path: Path) -> None:
    shutil.copy(REPO / "uv.lock", tmp_path / "uv.lock")
    text = (REPO / "pyproject.toml").read_text()
    assert '"soundfile>=0.12",' in text
    (tmp_path / "pyproject.toml").write_text(
        text.replace('"soundfile>=0.12",', '"soundfile>=0.12,<0.14",')
    )
    done = _uv("lock", "--check", cwd=tmp_path)
    assert done.returncode != 0
    assert "needs to be updated" in done.stderr or "out of date" in done.stderr, done.stderr


def test_the_gpu_wheel_list_takes_its_versions_from_the_lock(tmp_path: Path) -> None:
    tool = [sys.executable, str(REPO / "bench" / "gpu_wheel_pins.py"), "--uv", str(UV)]
    done = subprocess.run([*tool, "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listing = tmp_path / "gpu_wheels.txt"
    original = (REPO / "bench" / "gpu_wheels.txt").read_text()
    listing.write_text(original.replace("defusedxml==0.7.1", "defusedxml==0.6.0"))
    args = ["--list", str(listing), "--lock", str(REPO / "uv.lock")]
    done = subprocess.run([*tool, "--check", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "defusedxml==0.6.0 (lock: 0.7.1)" in done.stderr
    subprocess.run([*tool, "--write", *args], check=True, capture_output=True, timeout=120)
    assert listing.read_text() == original
