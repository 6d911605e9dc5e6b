"""Serving: our gRPC server through the client library, against upstream ChatTTS stream mode.

Each part (`--parts`: levels by default; all of them under --smoke and `make bench`) runs the
full-size dev model (random weights at the official shapes: timings do not depend on weight
values); compare ratios measured in one run, since a shared machine makes absolute times noisy.
- levels: upstream `Chat.infer(text, stream=True, skip_refine_text=True)` first (sequential
  requests of exactly --tokens tokens), then one server per `--modes` entry (`default`, the
  server's flags, or `gguf:<format>`) at each concurrency, through `AsyncTTSClient`: first
  audio (TTFA) p50/p95, the gap-free start (the earliest moment playback could start and never
  stall) p50/p95, per-stream RTF, audio seconds per wall second; from timers inside the server
  (bench/serving_profile) the cost per generated token of each part of the step; each server's
  cold start and resident memory. Writes serving.md after every level (a run stopped part-way
  keeps what it measured); `--time-budget-s` skips later levels.
- first-audio (bench/_first_audio.py): where a navigation prompt's first audio goes, one caller.
  Writes first_audio.md (first_audio_<language>.md).
- start, priority (bench/_serving_parts.py): start-up and memory (start.md); navigation prompts'
  first audio beside a caption backlog (prints).

Usage: python bench/bench_serving.py [--parts levels,first-audio,start,priority] [--tokens 200]
       [--requests 16] [--upstream-requests 3] [--concurrency 1,4,16] [--modes default,gguf:F16]
       [--out bench/results] [--logs DIR] [--time-budget-s S]
       python bench/bench_serving.py --parts first-audio [--repeats 5] [--language en|zh]
       python bench/bench_serving.py --parts start [--start-rounds 2] [--start-requests 4]
       python bench/bench_serving.py --parts priority [--bulk 16] [--reserved 2] [--prompts 10]
       python bench/bench_serving.py --smoke    # every part, tiny model, a temp folder
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _common import (
    CACHE,
    REPO,
    Call,
    Load,
    arguments,
    load_line,
    proc_mib,
    run_load,
    server_log_facts,
    synthesize,
)
from _first_audio import run_first_audio
from _serving_parts import add_part_arguments, run_priority, run_start, smoke
from _serving_report import Level, ServerFacts, cost_per_token, read_profile, write_report

from chattts_client import AsyncTTSClient
from chattts_devtools.launcher import ServerProcess, launch
from chattts_proto.chattts.v1 import tts_pb2

TEXT_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike"
PROFILE_HOOK = REPO / "bench" / "serving_profile"
PARTS = ("levels", "first-audio", "start", "priority")


def text_for(i: int) -> str:
    words = TEXT_WORDS.split()
    return "this is request " + " ".join(words[(i + k) % len(words)] for k in range(8)) + "."


async def grpc_load(target: str, concurrency: int, requests: int, tokens: int, base: int) -> Load:
    def config(i: int) -> tts_pb2.SynthesisConfig:
        sampling = tts_pb2.Sampling(seed=i, min_new_tokens=tokens, max_new_tokens=tokens)
        return tts_pb2.SynthesisConfig(voice=tts_pb2.Voice(seed=2), sampling=sampling)

    async with AsyncTTSClient(target) as client:
        return await run_load(
            concurrency,
            requests,
            lambda i: synthesize(client, text_for(base + i), config(base + i)),
        )


def server_args(args: argparse.Namespace, mode: str) -> list[str]:
    """A `--modes` entry's server flags: `default` or `gguf:<format>`."""
    if mode != "default" and not mode.startswith("gguf:"):
        raise SystemExit(f"--modes: {mode!r} is neither default nor gguf:<format>")
    max_tokens = max(512, args.tokens + 256)
    return [
        *(["--gguf-format", mode.split(":", 1)[1]] if mode != "default" else []),
        "--device", args.device, "--dtype", args.dtype, "--max-streams", str(args.max_streams),
        "--max-tokens", str(max_tokens), "--max-new-tokens", str(max_tokens - 128),
        "--max-queue", str(max(64, args.requests * 2)), *args.server_arg,
    ]  # fmt: skip


def measure_level(
    srv: ServerProcess, args: argparse.Namespace, mode: str, c: int, profile: Path
) -> Level:
    """One concurrency: its calls, and the cost per token from the server's timers."""
    n = max(args.requests, c) if c > 1 else max(1, args.upstream_requests)
    time.sleep(0.5)
    before = read_profile(profile)
    load = asyncio.run(grpc_load(srv.target, c, n, args.tokens, 1000 * c))
    time.sleep(0.5)  # the profile file is rewritten every 0.2 s
    cost_ms = cost_per_token(before, read_profile(profile), load.wall_s)
    level = Level(f"ours {mode}", mode, c, load, cost_ms, os.getloadavg()[0])
    print(
        f"  {mode} c{c}: {len(load.calls)} requests, wall {load.wall_s:.1f} s, TTFA p50 "
        f"{level.p('ttfa_s', 50):.2f} s, gap-free p50 {level.p('gap_free_s', 50):.2f} s, RTF p50 "
        f"{level.p('rtf', 50):.2f}, {load.throughput:.2f} audio s/s, errors {load.errors} "
        f"{[c.detail[:200] for c in load.calls if not c.ok][:2]}, {load_line()}",
        flush=True,
    )
    return level


def run_mode(args: argparse.Namespace, mode: str, logs: Path, report: Report) -> None:
    """Start a server in `mode` and measure each concurrency; levels that would start after
    `report.deadline` are skipped."""
    profile = logs / f"profile-{mode}.json"
    profile.unlink(missing_ok=True)
    env = {"CHATTTS_PROFILE_OUT": str(profile), "PYTHONPATH": str(PROFILE_HOOK)}
    with launch(
        server_args(args, mode), dev_model=args.model, cache=args.cache, env=env,
        start_timeout_s=args.server_timeout, log_path=logs / f"server-{mode}.log",
    ) as srv:  # fmt: skip
        srv.wait_serving(args.server_timeout)
        asyncio.run(grpc_load(srv.target, 1, 1, min(args.tokens, 24), 10_000))  # warm
        for c in [int(c) for c in args.concurrency.split(",") if c]:
            if time.monotonic() > report.deadline:
                print(f"  {mode} c{c}: skipped, past --time-budget-s", flush=True)
                continue
            report.ours.append(measure_level(srv, args, mode, c, profile))
            report.write()  # as each level ends: a timeout keeps what ran
        facts = ServerFacts(rss_mib=proc_mib(srv.pid))
        srv.stop()
    facts.ready_s, facts.gpt, _ = server_log_facts(srv.log_text())
    report.servers[mode] = facts
    print(f"  {mode}: {facts.gpt}, ready in {facts.ready_s:.1f} s, {facts.rss_mib:.0f} MiB")
    report.write()


def run_upstream(model_dir: Path, device: str, tokens: int, requests: int) -> Level:
    import torch
    from ChatTTS import Chat

    from chattts_devtools.upstream import upstream_chat

    chat = upstream_chat(model_dir, torch.device(device))
    torch.manual_seed(2)
    params = Chat.InferCodeParams(
        spk_emb=chat.sample_random_speaker(),
        min_new_token=tokens, max_new_token=tokens, show_tqdm=False, manual_seed=0,
    )  # fmt: skip

    def one(i: int) -> Call:
        call = Call()
        for wav in chat.infer(
            text_for(i), stream=True, skip_refine_text=True, params_infer_code=params
        ):
            n = int(np.asarray(wav).size) if wav is not None else 0
            if n:
                call.arrivals.append(time.perf_counter() - call.started)
                call.durations.append(n / 24000)
        call.total_s = time.perf_counter() - call.started
        return call

    one(999)  # warm-up (not timed)
    level = Level("upstream stream", "fp32", 1, Load(1))
    started = time.perf_counter()
    for i in range(requests):
        call = one(i)
        level.load.calls.append(call)
        print(
            f"  upstream #{i}: TTFA {call.ttfa_s or 0:.2f} s, gap-free {call.gap_free_s:.2f} s, "
            f"total {call.total_s:.2f} s, audio {call.audio_s:.2f} s, {load_line()}",
            flush=True,
        )
    level.load.wall_s = time.perf_counter() - started
    return level


@dataclass
class Report:
    """The levels so far, written out whole after each."""

    args: argparse.Namespace
    deadline: float
    upstream: Level | None = None
    ours: list[Level] = field(default_factory=list)
    servers: dict[str, ServerFacts] = field(default_factory=dict)

    def write(self) -> str:
        return write_report(self.args, self.upstream, self.ours, self.servers)


def run_levels(args: argparse.Namespace) -> None:
    from chattts_server.devmodel.assets import build_dev_assets

    report = Report(args, time.monotonic() + args.time_budget_s)
    model_dir = Path(build_dev_assets(args.model, Path(args.cache)))
    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench_serving-logs-"))  # not results
    logs.mkdir(parents=True, exist_ok=True)
    print(f"levels; server logs in {logs}", flush=True)
    if not args.skip_upstream:
        print("(b) upstream ChatTTS, stream mode, sequential (measured first)", flush=True)
        report.upstream = run_upstream(model_dir, args.device, args.tokens, args.upstream_requests)
        report.write()
    for mode in [m for m in args.modes.split(",") if m]:
        print(f"(a) our server, {mode}", flush=True)
        run_mode(args, mode, logs, report)
    print(report.write())


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__, "every part, tiny model, few tokens, output to a temp folder")
    # fmt: off
    parser.add_argument("--parts", help="comma-separated: " + ", ".join(PARTS) + " (default: levels; with --smoke, all)")
    parser.add_argument("--tokens", type=int, default=200, help="audio tokens per stream")
    parser.add_argument("--requests", type=int, default=16, help="requests per level (>= c)")
    parser.add_argument("--upstream-requests", type=int, default=3, help="sequential upstream requests (and c1)")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--modes", default="default", help="servers to run, in turn: default (the server's default flags), gguf:<format>")
    parser.add_argument("--max-streams", type=int, default=16)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="server device")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"], help="the server's GPT dtype on CUDA (a CPU serves llama.cpp's GGUF format)")
    parser.add_argument("--model", default="full", choices=["tiny", "full"], help="dev model of levels, first-audio and start")
    parser.add_argument("--skip-upstream", action="store_true")
    parser.add_argument("--server-arg", action="append", default=[], help="extra chattts-server flag (repeatable)")
    parser.add_argument("--server-timeout", type=float, default=600)
    parser.add_argument("--cache", default=str(CACHE))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--logs", help="folder for the server logs and timer dumps (default: a temporary one)")
    parser.add_argument("--time-budget-s", type=float, default=float("inf"), help="start no load level after this many seconds (the report says which were skipped)")
    add_part_arguments(parser)
    # fmt: on
    args = parser.parse_args()
    args.parts = args.parts or (",".join(PARTS) if args.smoke else "levels")
    if args.smoke:
        smoke(args)
        args.model, args.tokens, args.requests, args.upstream_requests = "tiny", 24, 2, 1
        args.concurrency, args.max_streams, args.modes = "1,2", 2, "default"
        args.out = tempfile.mkdtemp(prefix="bench_serving-")
    return args


def main() -> None:
    args = parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"--parts: no such part {', '.join(sorted(unknown))}")
    runners = {
        "levels": run_levels,
        "first-audio": run_first_audio,
        "start": run_start,
        "priority": run_priority,
    }
    for part in parts:
        runners[part](args)


if __name__ == "__main__":
    main()
