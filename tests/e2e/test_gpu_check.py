"""bench/gpu_check.sh --dry-run: the GPU check proven on the CPU before GPU time is spent.

The dry run fetches the carried wheels (reusing .whl/ and .cache/ when present; PyPI on a fresh
clone), fails if they and the tree are over 60 MiB, installs them offline for Python 3.12 and
imports each; then the venv's Python, seeing only the packages the GPU machine will have,
imports the project and the benchmark, collects the CUDA test files and finds OGG_OPUS off
without PyAV; then the script's own budget and $OUT checks. Any wheel that cannot be fetched,
package that cannot import or file over the limits fails it. It has no time limit of its own
(a loaded machine makes it slower, not failed); under a minute on 2 idle cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """No timeout of its own: pytest's (300 s, or the test's mark) only guards against a hang."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT", "BUDGET_S")}
    return subprocess.run(
        args,
        cwd=REPO,
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard only: a fresh clone downloads the wheels first
def test_dry_run_does_everything_but_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run(["bash", str(SCRIPT), "--dry-run"], {"OUT": str(out)})
    log = done.stdout
    assert done.returncode == 0, log[-6000:]
    assert "== done: dry run ok" in log
    assert "(timeout" not in log  # no step of the dry run has a time limit
    # The wheels for 3.12 install and import; the image view imports everything.
    assert re.search(r"what travels: .* = (\d+) MiB \(at most 60\)", log)
    assert "== install: rc=0" in log
    assert re.search(r"import check ok in [\d.]+ s \(\d+ deferred", log)
    image = log.split("== imports_image", 1)[1]
    assert "(0 deferred" in image and "ok       bench_serving" in image
    assert re.search(r"^\d+ tests collected", image, re.M)
    assert "PyAV (av) not installed: the server refuses OGG_OPUS" in image
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["gpu.md", "gpu_check.log"]
    report = (out / "gpu.md").read_text()
    assert "- imports_image: rc=0" in report and "- dry run ok" in report


def test_a_budget_over_five_minutes_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = _run(["bash", str(SCRIPT), "--dry-run"], {"OUT": str(tmp_path), "BUDGET_S": "400"})
    assert done.returncode == 1, done.stdout
    assert "BUDGET CHECK FAILED" in done.stdout
    assert "== fetch" not in done.stdout


def test_the_import_check_fails_fast_when_carried_packages_are_missing() -> None:
    # -S: no site-packages at all, so no carried package is installed.
    done = _run([sys.executable, "-S", str(REPO / "bench" / "_gpu_imports.py")], {})
    assert done.returncode == 1, done.stdout
    assert "FAILED   transformers==4.57.6: not installed" in done.stdout
    assert "IMPORT CHECK FAILED" in done.stdout


def test_every_carried_pin_is_what_the_venv_runs() -> None:
    import importlib.metadata as md

    pins = [
        line.split()[0].split("==")
        for line in (REPO / "bench" / "gpu_wheels.txt").read_text().splitlines()
        if line.split("#", 1)[0].strip()
    ]
    assert len(pins) >= 30
    assert {name: md.version(name) for name, _ in pins} == dict(pins)
    assert "av" not in dict(
        pins
    )  # 36 MB: the server runs without it (tests/integration/test_without_pyav.py)


def _python312() -> str | None:
    import glob
    import shutil

    for candidate in [
        shutil.which("python3.12"),
        *glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12"),
    ]:
        if (
            candidate
            and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0
        ):
            return candidate
    return None


def test_a_gpu_run_stops_within_seconds_when_an_import_fails(tmp_path: Path) -> None:
    """The GPU path itself, on a Python 3.12 without torch: the carried wheels install, the
    import check fails (torch, numpy... absent) and the run ends there, saying so in gpu.md,
    before any test or benchmark starts."""
    python = _python312()
    if python is None:
        pytest.skip("no Python 3.12 here")
    if not list((REPO / ".whl").glob("*.whl")):
        pytest.skip("no .whl/ yet (the dry run above fetches it)")
    done = _run(["bash", str(SCRIPT)], {"OUT": str(tmp_path), "PYTHON": python})
    assert done.returncode == 1, done.stdout[-3000:]
    assert "== install: rc=0" in done.stdout
    assert "IMPORT CHECK FAILED" in done.stdout and "import torch: No module named" in done.stdout
    assert "== test_cuda" not in done.stdout and "== bench_serving" not in done.stdout
    report = (tmp_path / "gpu.md").read_text()
    assert "- stopped: the import check failed" in report
