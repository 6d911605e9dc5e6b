"""Every script in bench/ and tools/ answers --help and runs in its smoke mode, so none rots unseen.

Scripts are found by globbing: a new script without --help or --smoke fails here. The benchmarks
(bench/bench_*.py) run in smoke mode through `bench/run_all.py --smoke --only <one>`, a test
each (so pytest-xdist spreads them); the other scripts run on their own. Smoke runs use the tiny
dev model and write nothing into bench/results/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
# `_name.py` files are helpers, not scripts.
SCRIPTS = sorted(
    p
    for p in [*(REPO / "bench").glob("*.py"), *(REPO / "tools").glob("*.py")]
    if not p.name.startswith("_")
)
SHELL_SCRIPTS = sorted([*(REPO / "bench").glob("*.sh"), *(REPO / "tools").glob("*.sh")])
BENCHMARKS = [p for p in SCRIPTS if p.parent.name == "bench" and p.name.startswith("bench_")]
# A line each smoke run must print; scripts not listed must print something.
SMOKE_SAYS = {
    "soak.py": r"^RESULT: OK$",
    # Resumes timed, parked streams' memory.
    "bench_resume.py": r"^RESULT: resume p95 \d+\.\d ms to the first resumed audio; 2 parked",
    "gen_proto.py": r"up to date with protos/",
    # The sweep's verdict, the server's first chunk against a longer one, then the results file.
    "bench_lookahead.py": (
        r"^Smallest lookahead with SNR >= 30 dB(?s:.*)^## The server's shorter first chunk"
        r"(?s:.*)^wrote .*lookahead\.md"
    ),
    "run_all.py": r"^0 of \d+ benchmarks failed",
    # Time to first audio, then captions fed faster than the voice, without and with max_lag_s.
    "bench_captions.py": (
        r"^RESULT: time to first audio median \d+\.\d+ s(?s:.*)"
        r"^RESULT: feed 1\.3x the voice for 3 s: heard lag at the end \d+\.\d s without "
        r"max_lag_s, \d+\.\d s with 1 s"
    ),
    # Every prompt of the route ends with one SegmentEnd; some audio came.
    "bench_navigation.py": (
        r"^RESULT: 10 prompts: \d+ late, \d+ replaced, \d+ cut, \d+ expired, \d+ not spoken, "
        r"0 without SegmentEnd; first audio p50 \d+\.\d+ s"
    ),
    # A format per row with its step against the floor; then auto's step without and with the tap.
    "bench_decode_step.py": (
        r"^\| Q8_0\b.* \| \d+\.\d \(\d+\.\dx\) \|(?s:.*)"
        r"^RESULT: auto [\w-]+: batch 1 step \d+\.\d ms, \d+\.\d ms with the word-timing tap"
    ),
    # Every format against fp32, then auto's pick with its SNR and code agreement.
    "bench_quality.py": (
        r"^\| F32 \| [\d.]+ \| \d+\.\d \|(?s:.*)"
        r"^RESULT: auto [\w-]+ \(smallest within \d+ dB\): probe SNR \d+\.\d dB, "
        r"greedy codes = fp32 \d+\.\d% over \d+ teacher-forced steps; word bounds \d+\.\d ms"
    ),
    # Every part: the levels' report; the engine's parts of first audio per schedule, then the
    # client's through the server; a cold start; prompts' first audio idle and under
    # the caption backlog, and what the backlog lost.
    "bench_contexts.py": (
        r"^RESULT: \d+ contexts on one socket / \d+ sockets: first audio \d+\.\d+x, "
        r"throughput \d+\.\d+x"
    ),
    "bench_serving.py": (
        r"^wrote .*serving\.md(?s:.*)"
        r"^\| prefill \| \d+\.\d \|(?s:.*)^Through the server \(4/4, gRPC.*first audio \d+\.\d ms(?s:.*)"
        r"^RESULT: engine ready cold \d+\.\d s; resident serving \d+ MiB \(cold\)(?s:.*)"
        r"^RESULT: prompts' first-audio p95 loaded / idle = \d+\.\d+ .*lost"
    ),
}


# A benchmark's smoke run through run_all.py, longer than pytest's 300 s default on a busy 2-core
# machine (bench_neighbours took 252 s at load 11-15 when run_all ran them all in one test).
BENCH_SMOKE_S = 600


def _ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(REPO).as_posix() for p in paths]


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / d) for d in ("client", "server", "tools")]),
        "PYTHONUNBUFFERED": "1",
        # Smoke runs check that scripts work, not speed. One thread each: on a busy 2-core
        # machine spinning OpenMP workers made upstream ChatTTS 100x slower (6 s for 24 tokens).
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    return subprocess.run(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )


def _results_snapshot() -> dict[str, tuple[int, int]]:
    if not RESULTS.is_dir():
        return {}
    return {
        p.relative_to(RESULTS).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in RESULTS.rglob("*")
        if p.is_file()
    }


def _run_all_smoke(script: Path) -> str:
    """`run_all.py --smoke --only <script>`: run_all runs the one benchmark, so each runs as a
    test of its own (in parallel under pytest-xdist) and run_all is exercised by every one."""
    done = _run(
        [sys.executable, str(REPO / "bench" / "run_all.py"), "--smoke", "--only", script.name],
        timeout_s=BENCH_SMOKE_S,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"^0 of 1 benchmarks failed", done.stdout, re.M), done.stdout[-3000:]
    return done.stdout


def test_every_benchmark_is_run_by_run_all() -> None:
    text = (REPO / "bench" / "run_all.py").read_text()
    assert 'glob("bench_*.py")' in text  # so the smoke test below covers each BENCHMARKS entry
    assert BENCHMARKS


@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_script_answers_help(script: Path) -> None:
    done = _run([sys.executable, str(script), "--help"], timeout_s=60)
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("usage:"), done.stdout
    assert "--smoke" in done.stdout, f"{script.name} --help shows no --smoke"


@pytest.mark.slow
@pytest.mark.timeout(BENCH_SMOKE_S + 60)
@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_script_runs_in_smoke_mode(script: Path) -> None:
    results_before = _results_snapshot()
    if script in BENCHMARKS:
        output = _run_all_smoke(script)
        assert re.search(r"^-> rc 0 in", output, re.M), output[-3000:]
    elif script.name == "run_all.py":
        done = _run([sys.executable, str(script), "--smoke", "--only", "no_such.py"], 60)
        assert done.returncode == 2 and "no such benchmark no_such.py" in done.stdout
        output = "0 of 0 benchmarks failed"  # it runs every benchmark above, one at a time
    else:
        done = _run([sys.executable, str(script), "--smoke"], timeout_s=120)
        output = done.stdout
        assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    says = SMOKE_SAYS.get(script.name, r"\S")
    assert re.search(says, output, re.M), f"{script.name} --smoke printed no {says!r}"
    assert _results_snapshot() == results_before, f"{script.name} --smoke wrote into bench/results"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=_ids(SHELL_SCRIPTS))
def test_shell_script_parses(script: Path) -> None:
    done = _run(["bash", "-n", str(script)], timeout_s=30)
    assert done.returncode == 0, done.stdout
