"""A replica beside busy neighbours, default flags, with the contention levers off and on.

"off" is the thread setup before issue 21: libgomp's default spin (GOMP_SPINCOUNT=300000, made
explicit) and a fixed pool (--adaptive-threads off). "on" is today's default: no flag, no
thread environment (threads.py's spin default and the thread governor). Two parts, each
interleaving off and on so that load from other processes hits both alike:

1. Lone decode step: one worker process per lever (the GPT's step on llama.cpp, full ChatTTS
   GPT shapes, random weights, batch 1, each --modes entry a GGUF format), asked in turn for
   --steps steps, --alternations times; the median of each worker's medians and the fastest
   (the quietest moment: the best estimate of a lone step on a shared machine), each against
   "off". The "on" worker runs the governor after each step, as the engine does;
   --spin-counts adds workers at other GOMP_SPINCOUNTs without the governor.
2. Per-utterance time of replica A (tiny model unless --model, one stream of --tokens tokens)
   alone and beside: replica B, as busy (both streams at once); N plain busy loops (N = CPUs);
   an OpenMP process (torch multiplying 256x256 matrices with its default settings). For each
   lever and neighbour: median beside / median alone, over --rounds rounds. A last row does the
   same for a plain single-threaded process of fixed work (a second copy in the replica
   column): what perfect sharing costs on this machine while the run lasts, the figure to hold
   the replica's against on a machine other jobs also load.

Usage: python bench/bench_neighbours.py [--tokens 100] [--rounds 3] [--steps 40]
       [--alternations 4] [--modes Q8_0-mixed1] [--markdown bench/results/neighbours.md]
       python bench/bench_neighbours.py --smoke   # tiny shapes, one round, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, command, launch, load_line, table, write_result

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


def lever_env(variant: str) -> dict[str, str]:
    """No thread settings (the default), plus the lever's: "off" is libgomp's default spin
    made explicit; "GOMP_SPINCOUNT=N" that count, without the governor."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    paths = [str(REPO / d) for d in ("client", "server", "tools")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    if variant == "off":
        env["GOMP_SPINCOUNT"] = "300000"
    elif variant.startswith("GOMP_SPINCOUNT="):
        env["GOMP_SPINCOUNT"] = variant.partition("=")[2]
    return env


# -- part 1: the lone decode step ---------------------------------------------------------------


def _llamacpp_gpts(modes: list[str], smoke: bool) -> tuple[dict[str, Any], Any, int]:
    """A GGUF GPT per mode at ChatTTS's GPT shapes (tiny with `smoke`), a 100-token context
    prefilled; the decode batch of one row, and the context length."""
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaModel

    from chattts_server.engine.llamacpp_gpt import LlamaCppGPT
    from chattts_server.model.gguf_export import GGUFCache
    from chattts_server.model.llama import DecodeBatch, LlamaShape, PromptRun

    layers, hidden, heads, inter = (2, 128, 4, 256) if smoke else (20, 768, 12, 3072)
    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
        num_key_value_heads=heads, num_hidden_layers=layers, max_position_embeddings=4096,
        vocab_size=8,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaModel(config).eval()  # type: ignore[call-arg]
    shape, threads, context = LlamaShape.from_config(config), torch.get_num_threads(), 100
    files = GGUFCache(Path(tempfile.mkdtemp(prefix="neighbours-gguf-")), "neighbours")
    gpts = {
        mode: LlamaCppGPT(
            files.get(mode, model.state_dict(), shape, 10000.0, threads),
            shape, 1, context + 2, context + 2, threads, mode,
        )
        for mode in modes
    }  # fmt: skip
    for gpt in gpts.values():
        gpt.forward([PromptRun(0, torch.zeros(context, hidden), 0)], None)
    step = DecodeBatch(torch.tensor([0]), torch.randn(1, hidden), torch.tensor([context]))
    return gpts, step, context


def decode_worker(variant: str, modes: list[str], smoke: bool) -> None:
    """Reads step counts on stdin, answers the median step ms of each GGUF format as JSON."""
    from chattts_server.threads import configure_threads

    configure_threads(None)
    import torch

    from chattts_server.thread_governor import ThreadGovernor

    gpts, step, context = _llamacpp_gpts(modes, smoke)

    def set_threads(count: int) -> None:
        for gpt in gpts.values():
            gpt.set_threads(count)

    governor = ThreadGovernor.for_torch(also=set_threads) if variant == "on" else None
    print(json.dumps({"ready": torch.get_num_threads()}), flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            ms: dict[str, float] = {}
            for mode, gpt in gpts.items():
                times = []
                for _ in range(int(line)):
                    t0 = time.perf_counter()
                    gpt.forward([], step)
                    times.append((time.perf_counter() - t0) * 1e3)
                    gpt._lc.llama_memory_seq_rm(gpt._memory, 0, context, -1)  # the same context
                    if governor is not None:
                        governor.after_step()
                ms[mode] = statistics.median(times)
            print(json.dumps({"ms": ms, "threads": torch.get_num_threads()}), flush=True)


def _ask(proc: subprocess.Popen[str], steps: int) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{steps}\n")
    proc.stdin.flush()
    return dict(json.loads(proc.stdout.readline()))


def _alternate(args: argparse.Namespace, workers: dict[str, subprocess.Popen[str]]) -> tuple:
    """Each worker asked --alternations times, in turn (the order flipped every time)."""
    variants, modes = list(workers), args.modes.split(",")
    for variant, proc in workers.items():
        assert proc.stdout is not None
        if not proc.stdout.readline():
            raise RuntimeError(f"the {variant} decode worker exited ({proc.wait()})")
    for proc in workers.values():
        _ask(proc, 3)  # warm
    ms: dict[str, dict[str, list[float]]] = {v: {m: [] for m in modes} for v in variants}
    threads: dict[str, set[int]] = {v: set() for v in variants}
    for i in range(args.alternations):
        for variant in variants if i % 2 == 0 else variants[::-1]:
            answer = _ask(workers[variant], args.steps)
            threads[variant].add(answer["threads"])
            for mode in modes:
                ms[variant][mode].append(answer["ms"][mode])
    return ms, threads


def lone_decode_step(args: argparse.Namespace) -> list[str]:
    variants = [*LEVERS, *(f"GOMP_SPINCOUNT={n}" for n in args.spin_counts.split(",") if n)]
    cmd = [sys.executable, __file__, "--modes", args.modes, *(["--smoke"] if args.smoke else [])]
    workers = {
        v: subprocess.Popen(
            [*cmd, "--decode-worker", v], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=lever_env(v), cwd=REPO,
        )
        for v in variants
    }  # fmt: skip
    try:
        ms, threads = _alternate(args, workers)
    finally:
        for proc in workers.values():
            proc.kill()
            proc.wait()
    rows = []
    for mode in args.modes.split(","):
        off, off_best = statistics.median(ms["off"][mode]), min(ms["off"][mode])
        for v in variants:
            med, best = statistics.median(ms[v][mode]), min(ms[v][mode])
            rows.append([
                v, mode, f"{med:.2f}", f"{med / off:.3f}", f"{best:.2f}", f"{best / off_best:.3f}",
                ", ".join(f"{t:.1f}" for t in ms[v][mode]), sorted(threads[v]),
            ])  # fmt: skip
    header = ["variant", "mode", "median ms", "/ off", "fastest ask", "/ off"]
    return [table([*header, "medians of each ask", "intra-op threads"], rows)]


# -- part 2: replicas beside neighbours ---------------------------------------------------------


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


def _replicas(lever: str, args: argparse.Namespace) -> list[Any]:
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


def _round(args: argparse.Namespace, r: int, replicas: dict, alone: dict, beside: dict) -> None:
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


def replicas_beside_neighbours(args: argparse.Namespace) -> list[str]:
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100, help="audio tokens per utterance")
    parser.add_argument("--rounds", type=int, default=3, help="alone/beside rounds per lever")
    parser.add_argument("--steps", type=int, default=40, help="decode steps per ask (median)")
    parser.add_argument("--alternations", type=int, default=4, help="off/on asks per worker")
    parser.add_argument("--modes", default="Q8_0-mixed1", help="GGUF formats to time")
    parser.add_argument("--spin-counts", default="", help="also time the decode step at these GOMP_SPINCOUNTs")
    parser.add_argument("--model", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--parts", default="step,neighbours", help="step, neighbours or both")
    parser.add_argument("--markdown", default="", help="also write the tables here")
    parser.add_argument("--server-arg", action="append", default=[], help="a flag for both replicas, repeatable (e.g. --server-arg=--gguf-format --server-arg=F16)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, one round, few tokens, no markdown")
    parser.add_argument("--decode-worker", default="", help=argparse.SUPPRESS)
    # fmt: on
    args = parser.parse_args()
    if args.decode_worker:
        decode_worker(args.decode_worker, args.modes.split(","), args.smoke)
        return
    if args.smoke:
        args.tokens, args.rounds, args.steps, args.alternations = 12, 1, 3, 2
        args.modes, args.markdown = "Q8_0", ""
    from chattts_server.devmodel.assets import build_dev_assets

    build_dev_assets(args.model, Path(args.cache))  # once, before four replicas start on it
    header = f"{load_line()} at the start; command: {command()}"
    print(header, flush=True)
    out = [f"# A replica beside busy neighbours\n\n{header}.\n"]
    parts = {
        "step": ("## Lone decode step, batch 1 (median ms)\n", lone_decode_step),
        "neighbours": ("## Per-utterance time beside a neighbour / alone (medians)\n", replicas_beside_neighbours),
    }  # fmt: skip
    for name in args.parts.split(","):
        title, run = parts[name]
        section = [title, *run(args)]
        print("\n".join(section), flush=True)
        out += [*section, ""]
    print(f"{load_line()} at the end", flush=True)
    if args.markdown:
        write_result(args.markdown, "\n".join(out))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
