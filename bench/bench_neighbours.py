"""A replica beside busy neighbours, default flags, with the contention levers off and on.

"off" is the thread setup before issue 21: libgomp's default spin (GOMP_SPINCOUNT=300000, made
explicit) and a fixed pool (--adaptive-threads off). "on" is today's default: no flag, no
thread environment (threads.py's spin default and the thread governor). Two parts, each
interleaving off and on so that load from other processes hits both alike:

1. Lone decode step: one worker process per lever (the GPT's step on llama.cpp, full ChatTTS
   GPT shapes, random weights, batch 1, each --modes entry a GGUF format), asked in turn for --steps steps, --alternations times; the
   median of each worker's medians and the fastest of them (the quietest moment: the best
   estimate of a lone step on a shared machine), each against "off". The "on" worker runs the
   governor after each step, as the engine does; --spin-counts adds workers at other
   GOMP_SPINCOUNTs without the governor.
2. Per-utterance time of replica A (tiny model unless --model, one stream of --tokens tokens)
   alone and beside: replica B, as busy (both streams at once); N plain busy loops (N = CPUs);
   an OpenMP process (python multiplying 256x256 matrices with torch's default settings).
   For each lever and neighbour: median beside / median alone, over --rounds rounds. A last
   row does the same for a plain single-threaded process of fixed work (a second copy in the
   replica column): what perfect sharing costs on this machine while the run lasts, the
   figure to hold the replica's against on a machine other jobs also load.

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

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / d) for d in ("client", "server", "tools")]

from chattts_devtools.sharing import at_once, fixed_work_s, timed_utterance  # noqa: E402

LEVERS = ("off", "on")
NEIGHBOURS = ("replica", "loops", "openmp")
_PLAIN = "plain process"
"""The reference row: a single-threaded fixed-work process in place of the replica (beside a
second copy in the replica column), so each column's figure for perfect sharing."""
# What each lever changes, apart from the flags below.
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOMP_SPINCOUNT")
_THREAD_ENV += ("OMP_WAIT_POLICY", "OMP_DYNAMIC")
_OFF_ENV = {"GOMP_SPINCOUNT": "300000"}  # libgomp's default, explicit (threads.py keeps it)
_OPENMP_NEIGHBOUR = (
    "import torch\nx = torch.randn(256, 256)\nprint('ready', flush=True)\nwhile True:\n    x @ x\n"
)


def _env(lever: str) -> dict[str, str]:
    """The environment with no thread settings (the default), plus the lever's."""
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(REPO / d) for d in ("client", "server", "tools")), env.get("PYTHONPATH", "")]
    )
    return {**env, **(_OFF_ENV if lever == "off" else {})}


# -- part 1: the lone decode step ---------------------------------------------------------


def decode_worker(variant: str, modes: list[str], smoke: bool) -> None:
    """Reads step counts on stdin, answers the median step ms of each GGUF format as JSON."""
    from chattts_server.threads import configure_threads

    configure_threads(None)
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaModel

    from chattts_server.engine.llamacpp_gpt import LlamaCppGPT
    from chattts_server.model.gguf_export import GGUFCache
    from chattts_server.model.llama import DecodeBatch, LlamaShape, PromptRun
    from chattts_server.thread_governor import ThreadGovernor

    layers, hidden, heads, inter = (2, 128, 4, 256) if smoke else (20, 768, 12, 3072)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        vocab_size=8,
    )
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
    del model
    for gpt in gpts.values():
        gpt.forward([PromptRun(0, torch.zeros(context, hidden), 0)], None)
    step = DecodeBatch(torch.tensor([0]), torch.randn(1, hidden), torch.tensor([context]))

    def set_threads(count: int) -> None:
        for gpt in gpts.values():
            gpt.set_threads(count)

    governor = ThreadGovernor.for_torch(also=set_threads) if variant == "on" else None
    print(json.dumps({"ready": torch.get_num_threads()}), flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            steps = int(line)
            ms: dict[str, float] = {}
            for mode, gpt in gpts.items():
                times = []
                for _ in range(steps):
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


def _variant_env(variant: str) -> dict[str, str]:
    if variant.startswith("GOMP_SPINCOUNT="):
        return {**_env("off"), "GOMP_SPINCOUNT": variant.partition("=")[2]}
    return _env(variant)


def lone_decode_step(args: argparse.Namespace) -> list[str]:
    modes = args.modes.split(",")
    variants = [*LEVERS, *(f"GOMP_SPINCOUNT={n}" for n in args.spin_counts.split(",") if n)]
    workers = {
        variant: subprocess.Popen(
            [sys.executable, __file__, "--decode-worker", variant, "--modes", args.modes]
            + (["--smoke"] if args.smoke else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_variant_env(variant),
            cwd=REPO,
        )
        for variant in variants
    }
    try:
        for lever, proc in workers.items():
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {lever} decode worker exited ({proc.wait()})")
        results: dict[str, dict[str, list[float]]] = {v: {m: [] for m in modes} for v in variants}
        threads: dict[str, set[int]] = {variant: set() for variant in variants}
        for _, proc in workers.items():
            _ask(proc, 3)  # warm
        for i in range(args.alternations):
            for variant in variants if i % 2 == 0 else variants[::-1]:
                answer = _ask(workers[variant], args.steps)
                threads[variant].add(answer["threads"])
                for mode in modes:
                    results[variant][mode].append(answer["ms"][mode])
    finally:
        for proc in workers.values():
            proc.kill()
            proc.wait()
    lines = [
        "| variant | mode | median ms | / off | fastest ask | / off | medians of each ask "
        "| intra-op threads |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        off = statistics.median(results["off"][mode])
        off_best = min(results["off"][mode])
        for variant in variants:
            ms = statistics.median(results[variant][mode])
            best = min(results[variant][mode])
            lines.append(
                f"| {variant} | {mode} | {ms:.2f} | {ms / off:.3f} | {best:.2f} | "
                f"{best / off_best:.3f} | "
                f"{', '.join(f'{v:.1f}' for v in results[variant][mode])} | "
                f"{sorted(threads[variant])} |"
            )
    return lines


# -- part 2: replicas beside neighbours -----------------------------------------------------


def _utterance_s(target: str, seed: int, tokens: int) -> float:
    return timed_utterance(target, "a replica beside a busy neighbour.", seed, tokens, 900)[0]


def _both_s(targets: list[str], seed: int, tokens: int) -> list[float]:
    return at_once(lambda i: _utterance_s(targets[i], seed + i, tokens), len(targets))


def _start_neighbour(kind: str) -> list[subprocess.Popen[str]]:
    # A session of its own, as another service's: with sched_autogroup (Linux's default on
    # desktops and some VMs) the scheduler shares CPUs between sessions first, so a neighbour
    # in ours would take its time from the replica's share alone.
    env = _env("default")
    if kind == "loops":
        cmd = [sys.executable, "-c", "while True: pass"]
        return [
            subprocess.Popen(cmd, env=env, text=True) for _ in range(len(os.sched_getaffinity(0)))
        ]
    proc = subprocess.Popen(
        [sys.executable, "-c", _OPENMP_NEIGHBOUR], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # torch imported, about to loop
    return [proc]


def _work_s(copies: int, smoke: bool) -> float:
    """What perfect sharing costs on this machine at this moment (`fixed_work_s`)."""
    return fixed_work_s(copies, 1_000_000 if smoke else 12_000_000)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


class _Replicas:
    """Replicas A and B for one lever (environment and flags), started as operators would."""

    def __init__(self, lever: str, args: argparse.Namespace) -> None:
        from chattts_devtools.launcher import launch

        flags = ["--max-streams", "2", "--max-tokens", "1024", "--max-new-tokens", "800"]
        flags += args.server_arg
        if lever == "off":
            flags += ["--adaptive-threads", "off"]
        if args.smoke:
            flags.append("--no-warmup")
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(_env(lever))  # launch() passes this process's environment on
        try:
            self.servers = [launch(flags, dev_model=args.model, cache=args.cache) for _ in range(2)]
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def wait_serving(self) -> None:
        for srv in self.servers:
            srv.wait_serving()

    def log_line(self) -> str:
        return next(
            (ln.split(": ", 1)[-1].strip() for ln in self.servers[0].log if "threads: " in ln), ""
        )

    def changes(self) -> int:
        return sum(srv.count("intra-op (waited for a CPU") for srv in self.servers)

    def close(self) -> None:
        for srv in self.servers:
            srv.stop()
            srv.__exit__()


def replicas_beside_neighbours(args: argparse.Namespace) -> list[str]:
    replicas: dict[str, _Replicas] = {}
    rows = [*LEVERS, _PLAIN]
    alone: dict[str, list[float]] = {row: [] for row in rows}
    beside: dict[tuple[str, str], list[float]] = {
        (row, kind): [] for row in rows for kind in NEIGHBOURS
    }
    try:
        for lever in LEVERS:
            replicas[lever] = _Replicas(lever, args)  # all four load side by side
        for reps in replicas.values():
            reps.wait_serving()
        for reps in replicas.values():
            for srv in reps.servers:
                _utterance_s(srv.target, 1, args.tokens)  # first-request costs out of the way
        for r in range(args.rounds):
            for lever in LEVERS if r % 2 == 0 else LEVERS[::-1]:
                a, b = replicas[lever].servers
                alone[lever].append(_utterance_s(a.target, 10 + r, args.tokens))
                beside[lever, "replica"] += _both_s([a.target, b.target], 20 + 2 * r, args.tokens)
                alone[lever].append(_utterance_s(b.target, 30 + r, args.tokens))
                for kind in ("loops", "openmp"):
                    procs = _start_neighbour(kind)
                    try:
                        beside[lever, kind].append(_utterance_s(a.target, 40 + r, args.tokens))
                    finally:
                        _stop(procs)
                print(
                    f"round {r + 1} {lever}: alone {alone[lever][-2:]}, "
                    + ", ".join(f"{k} {beside[lever, k][-1]:.2f}" for k in NEIGHBOURS),
                    flush=True,
                )
            alone[_PLAIN].append(_work_s(1, args.smoke))
            beside[_PLAIN, "replica"].append(_work_s(2, args.smoke))
            for kind in ("loops", "openmp"):
                procs = _start_neighbour(kind)
                try:
                    beside[_PLAIN, kind].append(_work_s(1, args.smoke))
                finally:
                    _stop(procs)
        lines = [
            "| lever | alone s | beside a busy replica | beside "
            f"{len(os.sched_getaffinity(0))} busy loops | beside an OpenMP process |",
            "|---|---|---|---|---|",
        ]
        for lever in rows:
            base = statistics.median(alone[lever])
            cells = []
            for kind in NEIGHBOURS:
                times = beside[lever, kind]
                cells.append(
                    f"{statistics.median(times) / base:.2f}x ({statistics.median(times):.2f} s)"
                )
            lines.append(f"| {lever} | {base:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
        med = {key: statistics.median(times) for key, times in beside.items()}
        base = {row: statistics.median(times) for row, times in alone.items()}
        fair = {
            k: (med["on", k] / base["on"]) / (med[_PLAIN, k] / base[_PLAIN]) for k in NEIGHBOURS
        }
        lines.append(
            "- on against perfect sharing (its slowdown / the plain process's): "
            + ", ".join(f"{k} {fair[k]:.2f}x" for k in NEIGHBOURS)
            + f"; off / on: alone {base['off'] / base['on']:.1f}x, "
            + ", ".join(f"{k} {med['off', k] / med['on', k]:.1f}x" for k in NEIGHBOURS)
        )
        for lever, reps in replicas.items():
            lines.append(
                f"- {lever}: `{reps.log_line()}`; thread count changes (both replicas): "
                f"{reps.changes()}"
            )
        lines.append(
            "- raw seconds: "
            + "; ".join(
                f"{lv} alone {[round(t, 2) for t in alone[lv]]}, "
                + ", ".join(f"{k} {[round(t, 2) for t in beside[lv, k]]}" for k in NEIGHBOURS)
                for lv in rows
            )
        )
        return lines
    finally:
        for reps in replicas.values():
            reps.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100, help="audio tokens per utterance")
    parser.add_argument("--rounds", type=int, default=3, help="alone/beside rounds per lever")
    parser.add_argument("--steps", type=int, default=40, help="decode steps per ask (median)")
    parser.add_argument("--alternations", type=int, default=4, help="off/on asks per worker")
    parser.add_argument("--modes", default="Q8_0-mixed1", help="GGUF formats to time")
    parser.add_argument(
        "--spin-counts", default="", help="also time the decode step at these GOMP_SPINCOUNTs"
    )
    parser.add_argument("--model", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--parts", default="step,neighbours", help="step, neighbours or both")
    parser.add_argument("--markdown", default="", help="also write the tables here")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="a flag for both replicas, repeatable (e.g. --server-arg=--gguf-format "
        "--server-arg=F16)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes, one round, few tokens, no markdown"
    )
    parser.add_argument("--decode-worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decode_worker:
        decode_worker(args.decode_worker, args.modes.split(","), args.smoke)
        return
    if args.smoke:
        args.tokens, args.rounds, args.steps, args.alternations = 12, 1, 3, 2
        args.modes, args.markdown = "Q8_0", ""
    from chattts_server.devmodel.assets import build_dev_assets

    build_dev_assets(args.model, Path(args.cache))
    header = (
        f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f} at the "
        f"start; command: `python {' '.join(sys.argv)}`"
    )
    print(header, flush=True)
    out = [f"# A replica beside busy neighbours\n\n{header}.\n"]
    parts = args.parts.split(",")
    if "step" in parts:
        section = ["## Lone decode step, batch 1 (median ms)\n", *lone_decode_step(args)]
        print("\n".join(section), flush=True)
        out += [*section, ""]
    if "neighbours" in parts:
        section = ["## Per-utterance time beside a neighbour / alone (medians)\n"]
        section += replicas_beside_neighbours(args)
        print("\n".join(section), flush=True)
        out += [*section, ""]
    print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(out) + "\n")
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
