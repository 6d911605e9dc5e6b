"""The linear-mode and compiled-decode tests rerun as other kinds of x86 CPU, on this one.

Each kind is this CPU with instructions taken away through the kernel libraries' own caps
(``ONEDNN_MAX_CPU_ISA``, ``FBGEMM_ENABLE_INSTRUCTIONS``, ``ATEN_CPU_CAPABILITY``): the kernels
then really run as they would there (on a VNNI machine, fbgemm capped at AVX2 gives the 16-25 dB
int8 of an AVX2-only EPYC). The tests assert what each offered mode promises, against
transformers' LlamaModel, and that ``--quantize auto`` serves nothing under its budget. Caps only
take away: on a machine without a feature, the kinds above it run as that machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS = {
    # AMD EPYC Rome/Milan, most cloud CPUs of a few years ago: AVX2, no VNNI, no AVX-512.
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"},
    # Skylake-SP: AVX-512 without VNNI (int8 still saturates).
    "avx512-no-vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"},
    # Cascade Lake: VNNI, no native bf16.
    "avx512-vnni": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1",
    },
}
ATEN = {"avx2": "avx2", "avx512-no-vnni": "avx512", "avx512-vnni": "avx512"}
TESTS = ["tests/model/test_linear_modes.py", "tests/model/test_compiled_decode.py"]
# Compiling the lossless modes costs ~20 s a kind and does not depend on which modes a CPU is
# offered (the unmasked run compiles them); the compiled lossy modes' budget test does.
SELECT = ["-k", "not matches_eager"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_linear_modes_hold_their_promises_as(kind: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(KINDS[kind], ATEN_CPU_CAPABILITY=ATEN[kind])
    # Inductor's cache does not key on ATEN_CPU_CAPABILITY: a graph compiled uncapped, loaded
    # capped at avx2, crashed (SIGSEGV in its fused RMSNorm). Each kind keeps a cache of its own.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(REPO / ".cache" / f"torchinductor-as-{kind}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            *TESTS,
            *SELECT,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"as {kind}:\n{tail}"
    assert " passed" in tail and " failed" not in tail
