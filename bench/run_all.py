"""`make bench`: every benchmark (bench/bench_*.py), one after another, each in its own process.

bench_serving.py (every part: upstream vs our server, first audio, start-up, priority) runs
first, then bench_decode_step.py (--steps 5), bench_lookahead.py and the other bench_*.py in
name order, each with its default flags. Results land in bench/results/. Exits 1 if any fails.

    python bench/run_all.py
    python bench/run_all.py --smoke   # each benchmark in its smoke mode; writes nothing here
    python bench/run_all.py --smoke --only bench_serving.py,bench_replicas   # just those
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
FIRST = ["bench_serving.py", "bench_decode_step.py", "bench_lookahead.py"]
DEFAULT_ARGS = {
    "bench_decode_step.py": ["--steps", "5"],
    "bench_serving.py": ["--parts", "levels,first-audio,start,priority"],
}


def benchmarks() -> list[Path]:
    """Every bench/bench_*.py, the known ones first in their usual order."""
    found = sorted(BENCH.glob("bench_*.py"))
    rank = {name: i for i, name in enumerate(FIRST)}
    return sorted(found, key=lambda p: (rank.get(p.name, len(FIRST)), p.name))


def run(cmd: list[str]) -> int:
    print("$ " + " ".join(cmd), flush=True)
    paths = [
        *(str(REPO / d) for d in ("client", "server", "tools")),
        os.environ.get("PYTHONPATH", ""),
    ]
    started = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    print(f"-> rc {rc} in {time.monotonic() - started:.0f} s\n", flush=True)
    return rc


def main() -> int:
    # fmt: off
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="run each benchmark with --smoke (tiny model, seconds each, output to temp dirs)")
    parser.add_argument("--only", default="", help="comma-separated bench_*.py names to run (default: all); the tests run each apart")
    # fmt: on
    args = parser.parse_args()
    chosen = benchmarks()
    if args.only:
        # With or without ".py": bench_serving and bench_serving.py name the same script.
        names = {n if n.endswith(".py") else f"{n}.py" for n in args.only.split(",") if n}
        unknown = names - {p.name for p in chosen}
        if unknown:
            parser.error(f"--only: no such benchmark {', '.join(sorted(unknown))}")
        chosen = [p for p in chosen if p.name in names]
    failed = []
    for script in chosen:
        extra = ["--smoke"] if args.smoke else DEFAULT_ARGS.get(script.name, [])
        if run([sys.executable, str(script), *extra]) != 0:
            failed.append(script.name)
    if not args.smoke:
        print(f"results in {BENCH / 'results'}")
    print(f"{len(failed)} of {len(chosen)} benchmarks failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
