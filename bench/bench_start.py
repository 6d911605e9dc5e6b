"""Start-up and memory: how long the engine takes to be ready, cold and on a restart, and how much
memory the serving process holds, with the server's default flags.

One server is started with an empty GGUF folder (`--gguf-cache-dir`: a cold start writes the
candidates, measures the quality budget, writes the served file, calibrates the alignment
heads), stopped, then started again on the same folder (a restart reads the format, the file and
the heads back), `--rounds` times. Each start: the log's "engine ready in" and its "GPT: ..."
line; the process's resident memory (VmRSS) once ready and after `--requests` streams, and its
peak (VmHWM). Medians over the rounds; the load average beside each.

Writes bench/results/start.md. Usage:
  python bench/bench_start.py [--rounds 2] [--requests 4] [--model full|tiny]
  python bench/bench_start.py --smoke    # tiny model, one round, a temp folder
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / p) for p in ("client", "server", "tools")]


def _status(pid: int, field: str) -> float:
    """A /proc/<pid>/status field in MiB (nan when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    line = next((ln for ln in text.splitlines() if ln.startswith(field + ":")), "")
    return int(line.split()[1]) / 1024 if line else float("nan")


def one_start(args: argparse.Namespace, folder: Path) -> dict[str, float | str]:
    from chattts_client import TTSClient
    from chattts_devtools.launcher import launch

    server_args = ["--gguf-cache-dir", str(folder)]
    with launch(
        server_args, dev_model=args.model, cache=Path(args.cache), start_timeout_s=900
    ) as srv:
        srv.wait_serving(900)
        ready_rss = _status(srv.pid, "VmRSS")
        with TTSClient(srv.target) as client:
            for i in range(args.requests):
                for _ in client.synthesize(f"Turn left in {100 * (i + 1)} metres.", timeout=300):
                    pass
        serving_rss, peak = _status(srv.pid, "VmRSS"), _status(srv.pid, "VmHWM")
        srv.stop()
    log = srv.log_text()
    ready = re.search(r"engine ready in (\d+\.\d+) s", log)
    gpt = re.search(r"GPT: (.*), built in (\d+\.\d+) s", log)
    return {
        "ready_s": float(ready.group(1)) if ready else float("nan"),
        "gpt": gpt.group(1) if gpt else "?",
        "gpt_s": float(gpt.group(2)) if gpt else float("nan"),
        "ready_rss": ready_rss,
        "serving_rss": serving_rss,
        "peak": peak,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--model", default="full", choices=["tiny", "full"])
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--smoke", action="store_true", help="tiny model, one round, temp out")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.rounds, args.requests = "tiny", 1, 1
        args.out = tempfile.mkdtemp(prefix="bench_start-")
    runs: dict[str, list[dict[str, float | str]]] = {"cold": [], "restart": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench_start-gguf-") as folder:
            for kind in ("cold", "restart"):
                runs[kind].append(one_start(args, Path(folder)))
                r = runs[kind][-1]
                print(
                    f"  {kind}: engine ready in {r['ready_s']:.1f} s ({r['gpt']}, built in "
                    f"{r['gpt_s']:.1f} s), resident {r['ready_rss']:.0f} MiB ready, "
                    f"{r['serving_rss']:.0f} MiB serving, peak {r['peak']:.0f} MiB, "
                    f"load average {r['load']:.2f}",
                    flush=True,
                )

    def med(kind: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in runs[kind])

    lines = [
        "# Start-up and memory, default flags",
        "",
        f"{args.model.capitalize()} dev model (random weights), CPU, the server's default flags "
        f"(--max-streams 16, --max-tokens 1536), medians of {args.rounds} rounds, "
        f"{args.requests} streams before the serving figure. Command: "
        f"`python {' '.join(sys.argv)}`",
        "",
        "| start | engine ready s | of which the GPT built s | resident ready MiB "
        "| resident serving MiB | peak MiB | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in runs:
        lines.append(
            f"| {kind} ({runs[kind][0]['gpt']}) | {med(kind, 'ready_s'):.1f} "
            f"| {med(kind, 'gpt_s'):.1f} | {med(kind, 'ready_rss'):.0f} "
            f"| {med(kind, 'serving_rss'):.0f} | {med(kind, 'peak'):.0f} | {med(kind, 'load'):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "start.md").write_text(text)
    print(text)
    print(
        f"RESULT: engine ready cold {med('cold', 'ready_s'):.1f} s, restart "
        f"{med('restart', 'ready_s'):.1f} s; resident serving {med('restart', 'serving_rss'):.0f} MiB"
    )
    print(f"wrote {out / 'start.md'}")


if __name__ == "__main__":
    main()
