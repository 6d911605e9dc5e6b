"""Client-side virtual environments for tests: an agent process runs apart from the TTS server,
often on a protobuf runtime the server cannot use (pipecat-ai pins protobuf<7, the server's
grpcio-health-checking needs >=7.35). Each venv is built once from exact pins and cached under
.cache/client-venvs/ (git-ignored); reruns, and CI with a warm pip cache, reuse it.

Our client is not installed into it: tests put `client/` on PYTHONPATH, so the venv tests the
working tree's client against the runtime the pins choose.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".cache" / "client-venvs"
# The framework version the Pipecat adapter is tested with (pyproject's extra allows a range).
PIPECAT_AI = "pipecat-ai==1.14.0"


def client_floor_pins() -> list[str]:
    """`protobuf==X` and `grpcio==Y` at the lower bounds the client declares in pyproject.toml:
    the lowest runtimes its stubs must load on."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = []
    for name in ("protobuf", "grpcio"):
        (spec,) = [d for d in deps if re.match(rf"{name}\s*[<>=!~]", d)]
        floor = re.search(r">=\s*([0-9][0-9.]*)", spec)
        assert floor, f"{spec!r} declares no lower bound"
        pins.append(f"{name}=={floor.group(1)}")
    return pins


def client_venv(name: str, pins: Sequence[str]) -> Path:
    """The python of a venv holding exactly `pins` (and what they pull in), built once."""
    key = hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()[:12]
    root = VENVS / f"{name}-{key}"
    python = root / "bin" / "python"
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers or two sessions may race
        if (root / ".ready").exists():
            return python
        venv.create(root, with_pip=True, clear=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
            check=True,
            timeout=600,
        )
        (root / ".ready").write_text("\n".join(pins) + "\n")
    return python


def run_in(python: Path, code: str, *args: str, timeout_s: float = 240.0) -> str:
    """Run `code` with the venv's python, our client on its path; its stdout, or fail with its
    output."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(PYTHONPATH=str(REPO / "client"), PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [str(python), "-c", code, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise AssertionError(
            f"client venv run failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-4000:]}"
        )
    return result.stdout
