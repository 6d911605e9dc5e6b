"""A replica beside busy neighbours, default flags, with the contention levers off and on.

"off" is the thread setup before issue 21: libgomp's default spin (GOMP_SPINCOUNT=300000, made
explicit) and a fixed pool (--adaptive-threads off). "on" is today's default: no flag, no
thread environment (threads.py's spin default and the thread governor). The per-utterance time
of replica A (tiny model unless --model, one stream of --tokens tokens) alone and beside:
replica B, as busy (both streams at once); N plain busy loops (N = CPUs); an OpenMP process
(torch multiplying 256x256 matrices with its default settings). For each lever and neighbour:
median beside / median alone, over --rounds rounds, the levers taking turns so that load from
other processes hits both alike. A last row does the same for a plain single-threaded process
of fixed work (a second copy in the replica column): what perfect sharing costs on this machine
while the run lasts, the figure to hold the replica's against on a machine other jobs also load.

Usage: python bench/bench_neighbours.py [--tokens 100] [--rounds 3] [--markdown FILE]
       python bench/bench_neighbours.py --smoke   # one round, few tokens, writes nothing
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import CACHE, REPO, arguments, command, launch, load_line, table, write_result

from chattts_devtools.sharing import at_once, fixed_work_s, timed_utterance

LEVERS = ("off", "on")
NEIGHBOURS = ("replica", "loops", "openmp")
PLAIN = "plain process"
"""The reference row: a single-threaded fixed-work process in place of the replica."""
THREAD_ENV = ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOMP_SPINCOUNT"]
THREAD_ENV += ["OMP_WAIT_POLICY", "OMP_DYNAMIC"]
OPENMP_NEIGHBOUR = (
    "import torch\nx = torch.randn(256, 256)\nprint('ready', flush=True)\nwhile True:\n    x @ x\n"
)


def lever_env(lever: str) -> dict[str, str]:
    """No thread settings (the default), plus "off"'s: libgomp's default spin made explicit."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    paths = [str(REPO / d) for d in ("client", "server", "tools")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    if lever == "off":
        env["GOMP_SPINCOUNT"] = "300000"
    return env


def _utterance_s(target: str, seed: int, tokens: int) -> float:
    return timed_utterance(target, "a replica beside a busy neighbour.", seed, tokens, 900)[0]


def _start_neighbour(kind: str) -> list[subprocess.Popen[str]]:
    # A session of its own, as another service's: with sched_autogroup (Linux's default on
    # desktops and some VMs) the scheduler shares CPUs between sessions first, so a neighbour
    # in ours would take its time from the replica's share alone.
    env = lever_env("default")
    if kind == "loops":
        cmd = [sys.executable, "-c", "while True: pass"]
        return [subprocess.Popen(cmd, env=env, text=True) for _ in os.sched_getaffinity(0)]
    cmd = [sys.executable, "-c", OPENMP_NEIGHBOUR]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # torch imported, about to loop
    return [proc]


def _beside(kind: str, work: Any) -> float:
    procs = _start_neighbour(kind)
    try:
        return float(work())
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _replicas(lever: str, args: Any) -> list[Any]:
    """Replicas A and B for one lever (environment and flags), started as operators would."""
    flags = ["--max-streams", "2", "--max-tokens", "1024", "--max-new-tokens", "800"]
    flags += [*args.server_arg, *(["--adaptive-threads", "off"] if lever == "off" else [])]
    flags += ["--no-warmup"] if args.smoke else []
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(lever_env(lever))  # launch() passes this process's environment on
    try:
        return [launch(flags, dev_model=args.model, cache=args.cache) for _ in range(2)]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _round(args: Any, r: int, replicas: dict, alone: dict, beside: dict) -> None:
    """One round: each lever's replica alone and beside each neighbour, then the plain row."""
    tokens = args.tokens
    for lever in LEVERS if r % 2 == 0 else LEVERS[::-1]:
        a, b = (srv.target for srv in replicas[lever])
        alone[lever].append(_utterance_s(a, 10 + r, tokens))
        both = at_once(lambda i: _utterance_s((a, b)[i], 20 + 2 * r + i, tokens), 2)  # noqa: B023
        beside[lever, "replica"] += both
        alone[lever].append(_utterance_s(b, 30 + r, tokens))
        for kind in ("loops", "openmp"):
            beside[lever, kind].append(_beside(kind, lambda: _utterance_s(a, 40 + r, tokens)))  # noqa: B023
        figures = ", ".join(f"{k} {beside[lever, k][-1]:.2f}" for k in NEIGHBOURS)
        print(f"round {r + 1} {lever}: alone {alone[lever][-2:]}, {figures}; {load_line()}")
    iterations = 1_000_000 if args.smoke else 12_000_000
    alone[PLAIN].append(fixed_work_s(1, iterations))
    beside[PLAIN, "replica"].append(fixed_work_s(2, iterations))
    for kind in ("loops", "openmp"):
        beside[PLAIN, kind].append(_beside(kind, lambda: fixed_work_s(1, iterations)))


def _neighbour_table(alone: dict, beside: dict, replicas: dict) -> list[str]:
    med = {key: statistics.median(times) for key, times in beside.items()}
    base = {row: statistics.median(times) for row, times in alone.items()}
    rows = [
        [row, f"{base[row]:.2f}", *(f"{med[row, k] / base[row]:.2f}x ({med[row, k]:.2f} s)" for k in NEIGHBOURS)]
        for row in alone
    ]  # fmt: skip
    header = ["lever", "alone s", "beside a busy replica"]
    header += [f"beside {len(os.sched_getaffinity(0))} busy loops", "beside an OpenMP process"]
    fair = {k: (med["on", k] / base["on"]) / (med[PLAIN, k] / base[PLAIN]) for k in NEIGHBOURS}
    lines = [table(header, rows), ""]
    lines.append(
        "- on against perfect sharing (its slowdown / the plain process's): "
        + ", ".join(f"{k} {fair[k]:.2f}x" for k in NEIGHBOURS)
        + f"; off / on: alone {base['off'] / base['on']:.1f}x, "
        + ", ".join(f"{k} {med['off', k] / med['on', k]:.1f}x" for k in NEIGHBOURS)
    )
    for lever, servers in replicas.items():
        log = next(
            (ln.split(": ", 1)[-1].strip() for ln in servers[0].log if "threads: " in ln), ""
        )
        changes = sum(srv.count("intra-op (waited for a CPU") for srv in servers)
        lines.append(f"- {lever}: `{log}`; thread count changes (both replicas): {changes}")
    raw = "; ".join(
        f"{lv} alone {[round(t, 2) for t in alone[lv]]}, "
        + ", ".join(f"{k} {[round(t, 2) for t in beside[lv, k]]}" for k in NEIGHBOURS)
        for lv in alone
    )
    return [*lines, f"- raw seconds: {raw}"]


def replicas_beside_neighbours(args: Any) -> list[str]:
    replicas: dict[str, list[Any]] = {}
    alone: dict[str, list[float]] = {row: [] for row in (*LEVERS, PLAIN)}
    beside: dict[tuple[str, str], list[float]] = {
        (row, kind): [] for row in alone for kind in NEIGHBOURS
    }
    try:
        for lever in LEVERS:
            replicas[lever] = _replicas(lever, args)  # all four load side by side
        for servers in replicas.values():
            for srv in servers:
                srv.wait_serving()
                _utterance_s(srv.target, 1, args.tokens)  # first-request costs out of the way
        for r in range(args.rounds):
            _round(args, r, replicas, alone, beside)
        return _neighbour_table(alone, beside, replicas)
    finally:
        for servers in replicas.values():
            for srv in servers:
                srv.stop()
                srv.__exit__()


def main() -> None:
    # fmt: off
    parser = arguments(__doc__, "one round, few tokens, no markdown")
    parser.add_argument("--tokens", type=int, default=100, help="audio tokens per utterance")
    parser.add_argument("--rounds", type=int, default=3, help="alone/beside rounds per lever")
    parser.add_argument("--model", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--cache", default=str(CACHE))
    parser.add_argument("--markdown", default="", help="also write the table here")
    parser.add_argument("--server-arg", action="append", default=[], help="a flag for both replicas, repeatable (e.g. --server-arg=--gguf-format --server-arg=F16)")
    # fmt: on
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.rounds, args.markdown = 12, 1, ""
    from chattts_server.devmodel.assets import build_dev_assets

    build_dev_assets(args.model, Path(args.cache))  # once, before four replicas start on it
    header = f"{load_line()} at the start; command: {command()}"
    print(header, flush=True)
    section = ["## Per-utterance time beside a neighbour / alone (medians)\n"]
    section += replicas_beside_neighbours(args)
    print("\n".join(section), flush=True)
    print(f"{load_line()} at the end", flush=True)
    if args.markdown:
        text = "\n".join([f"# A replica beside busy neighbours\n\n{header}.\n", *section])
        write_result(args.markdown, text)


if __name__ == "__main__":
    main()
