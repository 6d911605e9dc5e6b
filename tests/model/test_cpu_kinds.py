"""llama.cpp as an AVX2-only CPU (AMD EPYC Rome/Milan: no AVX-512, no VNNI, no AMX), on any x86-64
machine: its CPU backend built for AVX2 alone (tools/build_ggml_avx2.sh, run by `make install`)
and loaded in place of the native one by putting its folder first in LD_LIBRARY_PATH. Run as that
CPU, the llama.cpp tests hold (F32 equals torch fp32, the attention read for word timing, the
format the quality budget picks), and the budget picks the same format as on this CPU: the rule
does not depend on the instructions a CPU has. A machine without AVX-512 runs both sides alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_server.engine.llamacpp_gpt import llamacpp_unavailable

REPO = Path(__file__).resolve().parents[2]
_VERSION = next(
    line.split("==")[1].split('"')[0]
    for line in (REPO / "pyproject.toml").read_text().splitlines()
    if line.startswith("llamacpp = ")
)
AVX2_ONLY = REPO / ".cache" / "ggml-avx2" / _VERSION
pytestmark = [
    pytest.mark.skipif(llamacpp_unavailable() is not None, reason=str(llamacpp_unavailable())),
    pytest.mark.skipif(
        not (AVX2_ONLY / "libggml-cpu.so.0").exists(),
        reason=f"no AVX2-only llama.cpp backend in {AVX2_ONLY} (make install builds it)",
    ),
]

# Each format's SNR against torch fp32 on the quality probe, and what auto picks.
_CHOICE = """
import json, sys, torch, tempfile
from pathlib import Path
import llama_cpp
from chattts_server.engine.gpt_build import SMALLEST_FIRST, QUALITY_PROBE, fp32_reference
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT
from chattts_server.engine.prompts import PromptBuilder
from chattts_server.engine.utterance import VoiceSpec
from chattts_server.defaults import MIN_SNR_DB
from chattts_server.model.gguf_export import GGUFCache
from chattts_server.model.llama_layers import LlamaShape
from chattts_server.model.loader import load_chattts
from chattts_server.model.warmup_cache import snr_db, weights_digest

cpu = torch.device("cpu")
modules = load_chattts(sys.argv[1], cpu, torch.float32)
prompts = PromptBuilder(modules, cpu)
probe = prompts.code_prompt(prompts.normalize(QUALITY_PROBE), VoiceSpec(), 5).embeds
reference = fp32_reference(modules, probe)
shape = LlamaShape.from_config(modules.gpt_config)
files = GGUFCache(Path(sys.argv[2]), weights_digest(modules.gpt_state_dict))
snr = {}
for fmt in SMALLEST_FIRST:
    path = files.get(fmt, modules.gpt_state_dict, shape, 10000.0, 2)
    gpt = LlamaCppGPT(path, shape, 1, 64, 64, 2, fmt)
    snr[fmt] = snr_db(reference, gpt.hidden_states(0, probe))
    gpt.close()
chosen = next(f for f in SMALLEST_FIRST if snr[f] >= MIN_SNR_DB)
info = llama_cpp.llama_print_system_info().decode()
print(json.dumps({"snr": snr, "chosen": chosen, "cpu": info}))
"""


def _env(avx2_only: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    if avx2_only:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(AVX2_ONLY), env.get("LD_LIBRARY_PATH", "")) if p
        )
    env["PYTHONPATH"] = os.pathsep.join(
        str(REPO / p) for p in ("server", "client", "tools", "tests/helpers")
    )
    return env


def _choice(tiny_model_dir: Path, folder: Path, avx2_only: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHOICE, str(tiny_model_dir), str(folder)],
        env=_env(avx2_only),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_quality_budget_picks_the_same_format_as_avx2_only(tiny_model_dir, tmp_path):
    native = _choice(tiny_model_dir, tmp_path, avx2_only=False)
    masked = _choice(tiny_model_dir, tmp_path, avx2_only=True)
    print("native:", native["cpu"], native["snr"], "\nAVX2 only:", masked["cpu"], masked["snr"])
    assert "AVX2 = 1" in masked["cpu"]
    assert (
        "AVX512" not in masked["cpu"] and "VNNI" not in masked["cpu"] and "AMX" not in masked["cpu"]
    )
    assert masked["chosen"] == native["chosen"]
    for fmt, db in native["snr"].items():
        assert abs(masked["snr"][fmt] - db) < 1.0 or min(db, masked["snr"][fmt]) > 60, fmt


@pytest.mark.slow
def test_the_llamacpp_tests_pass_as_avx2_only() -> None:
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
            "tests/model/test_llamacpp_backend.py",
        ],
        cwd=REPO,
        env=_env(avx2_only=True),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"as an AVX2-only CPU:\n{tail}"
    assert " passed" in tail and " failed" not in tail
