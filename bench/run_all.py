"""`make bench`: every benchmark, one after another, each in its own process.

Runs bench_serving.py (upstream vs our server, plus the decode-step comparison at the
server's batch sizes), bench_decode_step.py (the full 1/4/8/16 sweep with the spread-slot case)
and bench_lookahead.py. Extra arguments go to bench_serving.py, e.g. a quick run:
    python bench/run_all.py --tokens 100 --requests 4
Set BENCH_DECODE_ARGS / BENCH_LOOKAHEAD_ARGS (e.g. "--tokens 100 --repeats 1") to shrink the lookahead sweep.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def run(cmd: list[str]) -> int:
    print("$ " + " ".join(cmd), flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "client"), str(REPO / "server"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    started = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO, env=env)
    print(f"-> rc {rc} in {time.monotonic() - started:.0f} s\n", flush=True)
    return rc


def main() -> int:
    failures = 0
    failures += run([sys.executable, str(BENCH / "bench_serving.py"), *sys.argv[1:]]) != 0
    decode = shlex.split(os.environ.get("BENCH_DECODE_ARGS", "--steps 5"))
    failures += run([sys.executable, str(BENCH / "bench_decode_step.py"), *decode]) != 0
    lookahead = BENCH / "bench_lookahead.py"
    if lookahead.exists():
        extra = shlex.split(os.environ.get("BENCH_LOOKAHEAD_ARGS", ""))
        failures += run([sys.executable, str(lookahead), *extra]) != 0
    print(f"results in {BENCH / 'results'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
