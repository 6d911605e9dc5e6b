"""bench_serving.py's start and priority parts, and the flags of every part but levels.

- start: engine ready cold (empty GGUF folder) and on a restart, resident memory ready, serving
  and peak, `--start-rounds` times. Writes start.md.
- priority: `--bulk` PRIORITY_BULK caption streams hold every place but `--reserved` ones while
  PRIORITY_INTERACTIVE navigation prompts arrive every `--prompt-interval-s` (tiny model unless
  --dev-model or --model-dir, or --target): prompts' first audio idle vs loaded, what the bulk
  streams lose. Prints.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from _common import (
    bench_server,
    caption_backlog,
    command,
    launch,
    load_line,
    pct,
    proc_mib,
    server_log_facts,
    synthesize,
    table,
    write_result,
)

from chattts_client import AsyncTTSClient
from chattts_proto.chattts.v1 import tts_pb2

PROMPTS = [
    "In three hundred metres, turn left onto Station Road.",
    "Keep right at the fork.",
    "Take the second exit at the roundabout.",
    "Your destination is on the left.",
]


def add_part_arguments(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    first = parser.add_argument_group("first-audio")
    first.add_argument("--repeats", type=int, default=5)
    first.add_argument("--schedules", default="4/4,8/8,4/8,4/2", help="first-chunk/lookahead tokens; the first is the default")
    first.add_argument("--language", default="en", choices=["en", "zh"], help="the navigation prompt's language")
    start = parser.add_argument_group("start")
    start.add_argument("--start-rounds", type=int, default=2, help="cold start + restart rounds")
    start.add_argument("--start-requests", type=int, default=4, help="streams before the serving figure")
    prio = parser.add_argument_group("priority")
    prio.add_argument("--bulk", type=int, default=16, help="caption streams (PRIORITY_BULK)")
    prio.add_argument("--reserved", type=int, default=2, help="--reserved-slots")
    prio.add_argument("--prompts", type=int, default=10, help="prompts per phase")
    prio.add_argument("--prompt-interval-s", type=float, default=2.0)
    prio.add_argument("--window-s", type=float, default=20.0, help="bulk-only window")
    prio.add_argument("--settle-s", type=float, default=5.0, help="bulk start-up, unmeasured")
    prio.add_argument("--word-interval-ms", type=int, default=150)
    prio.add_argument("--bulk-max-new-tokens", type=int, default=200)
    prio.add_argument("--prompt-max-new-tokens", type=int, default=120)
    prio.add_argument("--timeout-s", type=float, default=600.0)
    prio.add_argument("--target", help="the priority part's server, already running; else one is started")
    prio.add_argument("--dev-model", default="tiny", help="the priority part's dev model: tiny or full")
    prio.add_argument("--model-dir", help="real weights for the priority part's server")
    prio.add_argument("--server-log", help="write the priority part's server output to this file")
    # fmt: on


def smoke(args: argparse.Namespace) -> None:
    args.repeats, args.start_rounds, args.start_requests = 1, 1, 1
    args.bulk, args.prompts, args.prompt_interval_s = 3, 3, 0.5
    args.window_s, args.settle_s, args.bulk_max_new_tokens = 2.0, 2.0, 40
    args.word_interval_ms, args.prompt_max_new_tokens = 50, 20


# -- start ---------------------------------------------------------------------------------------


def one_start(args: argparse.Namespace, folder: Path) -> dict[str, float | str]:
    """One server on the GGUF folder `folder` (empty: a cold start); its log's times and its
    memory once ready, after --start-requests streams, and at its peak."""
    from chattts_client import TTSClient

    flags = ["--gguf-cache-dir", str(folder)]
    with launch(flags, dev_model=args.model, cache=args.cache, start_timeout_s=900) as srv:
        srv.wait_serving(900)
        ready_rss = proc_mib(srv.pid)
        with TTSClient(srv.target) as client:
            for i in range(args.start_requests):
                for _ in client.synthesize(f"Turn left in {100 * (i + 1)} metres.", timeout=300):
                    pass
        serving_rss, peak = proc_mib(srv.pid), proc_mib(srv.pid, "VmHWM")
        srv.stop()
    ready_s, gpt, gpt_s = server_log_facts(srv.log_text())
    return {"ready_s": ready_s, "gpt": gpt, "gpt_s": gpt_s, "ready_rss": ready_rss,
            "serving_rss": serving_rss, "peak": peak}  # fmt: skip


def run_start(args: argparse.Namespace) -> None:
    # The smoke run starts cold only: a restart is the same path, reading the cache back
    # (tests/integration/test_backend_e2e.py checks what it reads).
    kinds = ["cold"] if args.smoke else ["cold", "restart"]
    runs: dict[str, list[dict[str, float | str]]] = {kind: [] for kind in kinds}
    for _ in range(args.start_rounds):
        with tempfile.TemporaryDirectory(prefix="bench_start-gguf-") as folder:
            for kind in runs:
                r = one_start(args, Path(folder))
                runs[kind].append(r)
                print(
                    f"  {kind}: engine ready in {r['ready_s']:.1f} s ({r['gpt']}, built in "
                    f"{r['gpt_s']:.1f} s), resident {r['ready_rss']:.0f} MiB ready, "
                    f"{r['serving_rss']:.0f} MiB serving, peak {r['peak']:.0f} MiB, {load_line()}",
                    flush=True,
                )

    def med(kind: str, key: str, spec: str = ".0f") -> str:
        return format(statistics.median(float(r[key]) for r in runs[kind]), spec)

    header = ["start", "engine ready s", "of which the GPT built s", "resident ready MiB"]
    rows = [
        [f"{kind} ({runs[kind][0]['gpt']})", med(kind, "ready_s", ".1f"), med(kind, "gpt_s", ".1f"),
         med(kind, "ready_rss"), med(kind, "serving_rss"), med(kind, "peak")]
        for kind in runs
    ]  # fmt: skip
    text = (
        "# Start-up and memory, default flags\n\n"
        f"{args.model.capitalize()} dev model (random weights), CPU, the server's default flags "
        f"(--max-streams 16, --max-tokens 1536), medians of {args.start_rounds} rounds, "
        f"{args.start_requests} streams before the serving figure; {load_line()} at the end. "
        f"Command: {command()}\n\n" + table([*header, "resident serving MiB", "peak MiB"], rows)
    )
    print(text)
    write_result(Path(args.out) / "start.md", text)
    last = kinds[-1]  # the restart's memory, or the cold start's in a smoke run
    restart = f", restart {med('restart', 'ready_s', '.1f')} s" if "restart" in runs else ""
    print(
        f"RESULT: engine ready cold {med('cold', 'ready_s', '.1f')} s{restart}; "
        f"resident serving {med(last, 'serving_rss')} MiB ({last})"
    )


# -- priority ------------------------------------------------------------------------------------


async def prompt_ttfa(client: AsyncTTSClient, args: argparse.Namespace, i: int) -> float:
    """One navigation prompt (PRIORITY_INTERACTIVE); seconds to its first audio."""
    config = tts_pb2.SynthesisConfig(
        priority=tts_pb2.PRIORITY_INTERACTIVE,
        sampling=tts_pb2.Sampling(seed=i, max_new_tokens=args.prompt_max_new_tokens),
    )
    call = await synthesize(client, PROMPTS[i % len(PROMPTS)], config, timeout_s=args.timeout_s)
    if call.ttfa_s is None:
        raise RuntimeError(f"prompt {i} got no audio: {call.status} {call.detail}")
    return call.ttfa_s


async def prompts_every(client: AsyncTTSClient, args: argparse.Namespace) -> list[float]:
    """`--prompts` prompts, one starting every interval (they may overlap); their TTFAs."""
    tasks = []
    for i in range(args.prompts):
        if i:
            await asyncio.sleep(args.prompt_interval_s)
        tasks.append(asyncio.create_task(prompt_ttfa(client, args, i)))
    return list(await asyncio.gather(*tasks))


async def measure_priority(target: str, args: argparse.Namespace) -> dict:
    """Prompts on the idle server; the backlog alone for --window-s; prompts beside it."""
    async with AsyncTTSClient(target) as client:
        await prompt_ttfa(client, args, 0)  # warm the path
        idle = await prompts_every(client, args)
        stop, interval_s = asyncio.Event(), args.word_interval_ms / 1000
        backlog = caption_backlog(
            client, args.bulk, interval_s, args.bulk_max_new_tokens, stop=stop
        )
        await asyncio.sleep(args.settle_s)  # every caption stream is speaking
        t0 = time.perf_counter()
        await asyncio.sleep(args.window_s)
        t1 = time.perf_counter()
        loaded = await prompts_every(client, args)
        t2 = time.perf_counter()
        stop.set()
        bulk = list(await asyncio.gather(*backlog))
    return {"idle": idle, "loaded": loaded, "bulk": bulk, "windows": [(t0, t1), (t1, t2)]}


def run_priority(args: argparse.Namespace) -> None:
    server_args = [
        *("--max-streams", str(args.bulk + args.reserved)),
        *("--reserved-slots", str(args.reserved)),
        *("--max-queue", str(args.bulk + args.prompts)),
    ]
    print(f"priority, {load_line()}", flush=True)
    with bench_server(args, server_args) as target:
        f = asyncio.run(measure_priority(target, args))
    print(
        f"{args.bulk} bulk caption streams (one word every {args.word_interval_ms} ms) on "
        f"--max-streams {args.bulk + args.reserved} --reserved-slots {args.reserved}; "
        f"{args.prompts} interactive prompts, one every {args.prompt_interval_s:g} s"
    )
    for name, ttfa in (("idle server", f["idle"]), ("under the bulk load", f["loaded"])):
        print(
            f"prompts' first audio, {name}: p50 {pct(ttfa, 50):.3f} s, p95 {pct(ttfa, 95):.3f} s, "
            f"max {max(ttfa):.3f} s"
        )
    (a, b), (_, c) = f["windows"]
    rates = [sum(s.audio_between(x, y) for s in f["bulk"]) / (y - x) for x, y in f["windows"]]
    gaps = [pct([g for s in f["bulk"] for g in s.gaps_between(x, y)], 95) for x, y in f["windows"]]
    print(
        f"bulk streams: {rates[0]:.2f} audio s per s alone ({b - a:.0f} s), {rates[1]:.2f} with "
        f"the prompts ({c - b:.0f} s); chunk gap p95 {gaps[0]:.3f} s -> {gaps[1]:.3f} s"
    )
    errors = [f"{s.status}: {s.detail}" for s in f["bulk"] if not s.ok]
    if errors:
        print(f"bulk stream errors: {errors[:3]}")
    ratio = pct(f["loaded"], 95) / pct(f["idle"], 95)
    loss = 1 - rates[1] / rates[0] if rates[0] else float("nan")
    print(
        f"RESULT: prompts' first-audio p95 loaded / idle = {ratio:.2f} (target <= 1.5); "
        f"bulk audio rate lost while prompts run: {100 * loss:.0f}%; {load_line()}"
    )
