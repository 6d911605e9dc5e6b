"""Serving benchmark: upstream ChatTTS stream mode vs our gRPC server, default flags or a named format.

In one run, on the full-size dev model (random weights at the official shapes: timings do not
depend on weight values), upstream first (the reference every ratio needs), then ours:
  (a) our server (`chattts_server.main` through `chattts_server.launcher`, one subprocess per
      `--modes` entry: `default`, the server's default flags, or `gguf:<format>`, the GPT in
      that GGUF format) through the real client library (`AsyncTTSClient`), at each
      concurrency: time to first audio (TTFA) p50/p95, the gap-free start (the earliest moment
      playback could start and never stall: the maximum over chunks of arrival time minus the
      audio duration before that chunk) p50/p95, per-stream RTF, aggregate audio seconds per
      wall second; and, from timers inside the server (bench/serving_profile), the cost per
      generated token of the GPT step, heads + sampling, Decoder + vocoder, the rest of the
      engine step, audio encoding, and what is left (gRPC, asyncio, hand-off, idle);
      with `--transports grpc,http` each level runs again through the HTTP front door of the
      same server (POST /v1/audio/speech, pcm; levels named "<mode>/http");
  (b) upstream `Chat.infer(text, stream=True, skip_refine_text=True)`, sequential requests of
      exactly --tokens tokens: the same figures.
Writes <out>/serving.md and <out>/serving.png after upstream and after every load level, so a
run stopped part-way (a timeout) leaves what it measured; `--time-budget-s` skips the levels
that would start after it. Compare ratios measured in one run; a shared machine makes absolute
times noisy.

Each server's cold start (its log's "engine ready in") and resident memory after its levels
are reported too. Usage: python bench/bench_serving.py [--tokens 200] [--requests 16]
       [--upstream-requests 3] [--concurrency 1,4,16] [--modes default,gguf:F16] [--out bench/results]
       [--logs DIR] [--time-budget-s S] [--transports grpc,http]
       python bench/bench_serving.py --smoke    # tiny model, a few tokens, a temp folder
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(REPO / "client"),
    str(REPO / "server"),
    str(REPO / "tools"),
    str(REPO / "bench"),
]

TEXT_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
]
TOKENS_PER_S = 24000 / 256 / 2  # GPT steps per second of audio (46.875)
PROFILE_HOOK = REPO / "bench" / "serving_profile"
# Per-token cost rows: label, server timers summed (see serving_profile/sitecustomize.py).
COST_ROWS = [
    # gpt_decode_graphs: the decode step through CUDA graphs (which never calls decode).
    (
        "GPT step (decode + prefill)",
        ["gpt_forward", "gpt_decode", "gpt_decode_graphs", "gpt_prefill", "gpt_llamacpp"],
    ),
    ("heads + sampling", ["heads_sampling"]),
    ("Decoder + vocoder", ["decoder_vocoder", "decoder_vocoder_finish"]),
    ("rest of the engine step", []),  # engine_step minus the three above
    ("audio encoding", ["encoding", "encoding_opus"]),
    ("gRPC, asyncio, hand-off, idle", []),  # wall per token minus all of the above
]


def text_for(i: int) -> str:
    words = [TEXT_WORDS[(i + k) % len(TEXT_WORDS)] for k in range(8)]
    return "this is request " + " ".join(words) + "."


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def gap_free_start(arrivals: list[float], durations: list[float]) -> float:
    """Earliest playback start (s after the request) that never runs out of audio: chunk i
    arrives at arrivals[i] and must not be needed before start + sum(durations[:i])."""
    before, worst = 0.0, 0.0
    for arrival, duration in zip(arrivals, durations, strict=True):
        worst = max(worst, arrival - before)
        before += duration
    return worst


@dataclass
class Level:
    name: str
    mode: str
    concurrency: int
    ttfa_s: list[float] = field(default_factory=list)
    gap_free_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    audio_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    cost_ms: dict[str, float] = field(default_factory=dict)  # per generated token
    tokens: int = 0
    load_average: float = float("nan")  # 1-minute, as the level ended

    def add(self, arrivals: list[float], durations: list[float], total: float) -> None:
        self.ttfa_s.append(arrivals[0] if arrivals else total)
        self.gap_free_s.append(gap_free_start(arrivals, durations) if arrivals else total)
        self.total_s.append(total)
        self.audio_s.append(sum(durations))

    @property
    def rtf(self) -> list[float]:
        return [t / a for t, a in zip(self.total_s, self.audio_s, strict=True) if a > 0]

    @property
    def throughput(self) -> float:
        """Audio seconds generated per wall second, all streams together."""
        return sum(self.audio_s) / self.wall_s if self.wall_s else float("nan")


# -- (a) our server ---------------------------------------------------------------------------


def read_profile(path: Path) -> dict[str, list[float]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def cost_per_token(
    before: dict[str, list[float]], after: dict[str, list[float]], wall_s: float
) -> tuple[dict[str, float], int]:
    def spent(keys: list[str]) -> float:
        return sum(after.get(k, [0, 0])[0] - before.get(k, [0, 0])[0] for k in keys)

    tokens = int(spent(["decode_rows"]))
    if tokens <= 0:
        return {}, 0
    ms = {label: 1e3 * spent(keys) / tokens for label, keys in COST_ROWS if keys}
    engine = 1e3 * spent(["engine_step"]) / tokens
    inside = sum(ms[label] for label, _ in COST_ROWS[:3])
    ms["rest of the engine step"] = max(0.0, engine - inside)
    ms["all-in (wall / tokens)"] = 1e3 * wall_s / tokens
    ms["gRPC, asyncio, hand-off, idle"] = max(
        0.0, ms["all-in (wall / tokens)"] - engine - ms["audio encoding"]
    )
    return ms, tokens


async def run_level(
    target: str, mode: str, concurrency: int, requests: int, tokens: int, base: int
) -> Level:
    from chattts_client import AsyncTTSClient
    from chattts_client.messages import AudioChunkEvent
    from chattts_proto.chattts.v1 import tts_pb2

    level = Level(f"ours {mode}", mode, concurrency)
    sem = asyncio.Semaphore(concurrency)
    client = AsyncTTSClient(target)

    async def one(i: int) -> None:
        config = tts_pb2.SynthesisConfig(
            voice=tts_pb2.Voice(seed=2),
            sampling=tts_pb2.Sampling(seed=base + i, min_new_tokens=tokens, max_new_tokens=tokens),
        )
        async with sem:
            arrivals, durations = [], []
            try:
                t0 = time.perf_counter()
                stream = client.synthesize(text_for(base + i), config=config, timeout=900)
                async for event in stream:
                    if isinstance(event, AudioChunkEvent):
                        arrivals.append(time.perf_counter() - t0)
                        durations.append(event.duration_s)
                total = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - counted and reported
                level.errors += 1
                print(f"  request {i} failed: {exc!r}"[:300], flush=True)
                return
            level.add(arrivals, durations, total)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    level.wall_s = time.perf_counter() - start
    await client.close()
    return level


async def run_level_http(
    url: str, mode: str, concurrency: int, requests: int, tokens: int, base: int
) -> Level:
    """The same work as `run_level`, through POST /v1/audio/speech (pcm, audio stream format):
    each body chunk's arrival and its audio duration (s16le at 24 kHz)."""
    import httpx2

    level = Level(f"ours {mode} over HTTP", f"{mode}/http", concurrency)
    sem = asyncio.Semaphore(concurrency)
    limits = httpx2.Limits(max_connections=max(concurrency, 1) + 4)

    async with httpx2.AsyncClient(base_url=url, timeout=900, limits=limits) as client:

        async def one(i: int) -> None:
            body = {
                "model": "chattts",
                "input": text_for(base + i),
                "response_format": "pcm",
                "chattts": {
                    "voice": {"seed": 2},
                    "sampling": {
                        "seed": base + i,
                        "min_new_tokens": tokens,
                        "max_new_tokens": tokens,
                    },
                },
            }
            async with sem:
                arrivals, durations = [], []
                try:
                    t0 = time.perf_counter()
                    async with client.stream("POST", "/v1/audio/speech", json=body) as r:
                        r.raise_for_status()
                        async for chunk in r.aiter_bytes():
                            arrivals.append(time.perf_counter() - t0)
                            durations.append(len(chunk) / 2 / 24000)
                    total = time.perf_counter() - t0
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    level.errors += 1
                    print(f"  request {i} failed: {exc!r}"[:300], flush=True)
                    return
                level.add(arrivals, durations, total)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        level.wall_s = time.perf_counter() - start
    return level


def merge_levels(into: Level | None, part: Level) -> Level:
    """Two runs of one level as one: samples pooled, walls and per-token costs added up."""
    if into is None:
        return part
    for name in ("ttfa_s", "gap_free_s", "total_s", "audio_s"):
        getattr(into, name).extend(getattr(part, name))
    tokens = into.tokens + part.tokens
    if tokens:
        into.cost_ms = {
            k: (into.cost_ms.get(k, 0) * into.tokens + v * part.tokens) / tokens
            for k, v in part.cost_ms.items()
        }
    into.tokens = tokens
    into.wall_s += part.wall_s
    into.errors += part.errors
    return into


@dataclass
class ServerFacts:
    """What one server's log and process say beside its levels."""

    ready_s: float = float("nan")  # "engine ready in X s": load, GGUF, warm-up
    rss_mib: float = float("nan")  # resident memory after its levels
    gpt: str = ""  # the log's "GPT: ..." line


SERVERS: dict[str, ServerFacts] = {}


def server_mode_args(mode: str) -> list[str]:
    """The server flags of one `--modes` entry: `default` (the server's own defaults) or
    `gguf:<format>` (the GPT in that GGUF format)."""
    if mode == "default":
        return []
    if mode.startswith("gguf:"):
        return ["--gguf-format", mode.split(":", 1)[1]]
    raise SystemExit(f"--modes: {mode!r} is neither default nor gguf:<format>")


def _rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    line = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), "")
    return int(line.split()[1]) / 1024 if line else float("nan")


def run_mode(
    args: argparse.Namespace,
    mode: str,
    cache: Path,
    logs: Path,
    on_level: Callable[[Level | None], None],
    deadline: float,
) -> None:
    """Start a server in `mode`, measure each concurrency level, hand each to `on_level` as it
    completes; levels that would start after `deadline` (time.monotonic()) are skipped."""
    from chattts_devtools.launcher import launch

    profile = logs / f"profile-{mode}.json"
    profile.unlink(missing_ok=True)
    os.environ["CHATTTS_PROFILE_OUT"] = str(profile)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(PROFILE_HOOK), os.environ.get("PYTHONPATH", "")] if p
    )
    max_tokens = max(512, args.tokens + 256)
    server_args = [
        *server_mode_args(mode), "--device", args.device, "--dtype", args.dtype,
        "--max-streams", str(args.max_streams),
        "--max-tokens", str(max_tokens), "--max-new-tokens", str(max_tokens - 128),
        "--max-queue", str(max(64, args.requests * 2)),
        *args.server_arg,
    ]  # fmt: skip
    transports = [t for t in args.transports.split(",") if t]
    with launch(
        server_args,
        dev_model=args.model,
        cache=cache,
        http="http" in transports,
        start_timeout_s=args.server_timeout,
        log_path=logs / f"server-{mode}.log",
    ) as srv:
        srv.wait_serving(args.server_timeout)
        asyncio.run(run_level(srv.target, mode, 1, 1, min(args.tokens, 24), 10_000))  # warm
        for c in [int(c) for c in args.concurrency.split(",") if c]:
            if time.monotonic() > deadline:
                print(f"  {mode} c{c}: skipped, past --time-budget-s", flush=True)
                continue
            n = max(args.requests, c) if c > 1 else max(1, args.upstream_requests)
            # The same work over each front door of one server; with --rounds R the doors take
            # turns R times (a shared machine's noise then falls on both alike).
            merged: dict[str, Level] = {}
            for _ in range(args.rounds):
                for transport in transports:
                    time.sleep(0.5)
                    before = read_profile(profile)
                    if transport == "http":
                        work = run_level_http(srv.http_url, mode, c, n, args.tokens, 1000 * c)
                    else:
                        work = run_level(srv.target, mode, c, n, args.tokens, 1000 * c)
                    part = asyncio.run(work)
                    time.sleep(0.5)  # the profile file is rewritten every 0.2 s
                    part.cost_ms, part.tokens = cost_per_token(
                        before, read_profile(profile), part.wall_s
                    )
                    merged[transport] = merge_levels(merged.get(transport), part)
            for level in merged.values():
                level.load_average = os.getloadavg()[0]
                print(
                    f"  {level.mode} c{c}: {len(level.total_s)} requests, wall {level.wall_s:.1f} s, "
                    f"TTFA p50 "
                    f"{pct(level.ttfa_s, 50):.2f} s, gap-free p50 "
                    f"{pct(level.gap_free_s, 50):.2f} s, RTF p50 {pct(level.rtf, 50):.2f}, "
                    f"{level.throughput:.2f} audio s/s, errors {level.errors}, "
                    f"load average {level.load_average:.2f}",
                    flush=True,
                )
                on_level(level)
        facts = ServerFacts(rss_mib=_rss_mib(srv.pid))
        srv.stop()
    log_text = srv.log_text()
    ready = re.search(r"engine ready in (\d+\.\d+) s", log_text)
    gpt = re.search(r"GPT: (.*), built in .*$", log_text, re.M)
    facts.ready_s = float(ready.group(1)) if ready else float("nan")
    facts.gpt = gpt.group(1) if gpt else "?"
    SERVERS[mode] = facts
    print(
        f"  {mode}: {facts.gpt}, engine ready in {facts.ready_s:.1f} s, "
        f"resident {facts.rss_mib:.0f} MiB",
        flush=True,
    )
    on_level(None)


# -- (b) upstream -----------------------------------------------------------------------------


def run_upstream(model_dir: Path, device: str, tokens: int, requests: int) -> Level:
    import torch
    from ChatTTS import Chat

    from chattts_devtools.upstream import upstream_chat

    chat = upstream_chat(model_dir, torch.device(device))
    torch.manual_seed(2)
    spk = chat.sample_random_speaker()
    params = Chat.InferCodeParams(
        spk_emb=spk, min_new_token=tokens, max_new_token=tokens, show_tqdm=False, manual_seed=0
    )
    level = Level("upstream stream", "fp32", 1)

    def one(i: int) -> tuple[list[float], list[float], float]:
        t0 = time.perf_counter()
        arrivals, durations = [], []
        for wav in chat.infer(
            text_for(i), stream=True, skip_refine_text=True, params_infer_code=params
        ):
            n = int(np.asarray(wav).size) if wav is not None else 0
            if n:
                arrivals.append(time.perf_counter() - t0)
                durations.append(n / 24000)
        return arrivals, durations, time.perf_counter() - t0

    one(999)  # warm-up (not timed)
    start = time.perf_counter()
    for i in range(requests):
        arrivals, durations, total = one(i)
        level.add(arrivals, durations, total)
        print(
            f"  upstream #{i}: TTFA {level.ttfa_s[-1]:.2f} s, gap-free {level.gap_free_s[-1]:.2f} s, "
            f"total {total:.2f} s, audio {level.audio_s[-1]:.2f} s",
            flush=True,
        )
    level.wall_s = time.perf_counter() - start
    return level


# -- report -----------------------------------------------------------------------------------


def write_report(args: argparse.Namespace, up: Level | None, ours: list[Level], out: Path) -> str:
    lines = [
        "# Serving benchmark",
        "",
        f"{args.model.capitalize()} dev model (random weights), {args.device}, "
        f"{args.tokens} tokens per "
        f"stream ({args.tokens / TOKENS_PER_S:.2f} s of audio), server --max-streams "
        f"{args.max_streams}, one server per `--modes` entry (`default`: the server's default "
        "flags; `gguf:<format>`: the GPT in that format). "
        f"Load average at the end {os.getloadavg()[0]:.1f}. Command: `python {' '.join(sys.argv)}`",
        "",
        "| run | streams | requests | TTFA p50 s | TTFA p95 s | gap-free start p50 s "
        "| gap-free p95 s | RTF p50 (per stream) | RTF max | audio s / wall s | errors "
        "| load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in ([up] if up else []) + ours:
        lines.append(
            f"| {lv.name} | {lv.concurrency} | {len(lv.total_s)} | {pct(lv.ttfa_s, 50):.2f} "
            f"| {pct(lv.ttfa_s, 95):.2f} | {pct(lv.gap_free_s, 50):.2f} | {pct(lv.gap_free_s, 95):.2f} "
            f"| {pct(lv.rtf, 50):.2f} | {max(lv.rtf, default=float('nan')):.2f} "
            f"| {lv.throughput:.2f} | {lv.errors} | {lv.load_average:.2f} |"
        )
    lines.append("")
    if SERVERS:
        lines += [
            "| server | GPT | engine ready (cold start) s | resident memory after its levels MiB |",
            "|---|---|---|---|",
        ]
        for mode, facts in SERVERS.items():
            lines.append(f"| {mode} | {facts.gpt} | {facts.ready_s:.1f} | {facts.rss_mib:.0f} |")
        lines.append("")
    if up and ours:
        lines += ["Against upstream in the same run (targets of issue 47 in brackets):", ""]
        for mode in dict.fromkeys(lv.mode for lv in ours):
            by_c = {lv.concurrency: lv for lv in ours if lv.mode == mode}
            parts = []
            if 1 in by_c and by_c[1].ttfa_s:
                c1 = by_c[1]
                parts.append(
                    f"1 stream: first audio {pct(c1.ttfa_s, 50):.3f} s = "
                    f"{pct(c1.ttfa_s, 50) / pct(up.ttfa_s, 50):.3f}x upstream's [<= 0.04x], "
                    f"RTF {pct(c1.rtf, 50):.2f} [<= 0.6], gap-free start "
                    f"{pct(c1.gap_free_s, 50):.2f} s [<= 0.5 s]"
                )
            if 4 in by_c and by_c[4].rtf:
                c4 = by_c[4]
                parts.append(
                    f"4 streams: RTF max {max(c4.rtf):.2f} [<= 1], gap-free start max "
                    f"{max(c4.gap_free_s):.2f} s [<= 0.5 s]"
                )
            top = by_c[max(by_c)]
            parts.append(
                f"{top.concurrency} streams throughput {top.throughput / up.throughput:.1f}x "
                f"upstream sequential [>= 20x], first-audio p95 {pct(top.ttfa_s, 95):.2f} s "
                "[<= 1.0 s]"
            )
            lines.append(f"- {mode}: " + "; ".join(parts))
        lines.append("")
    cost_levels = [lv for lv in ours if lv.cost_ms]
    if cost_levels:
        labels = [label for label, _ in COST_ROWS] + ["all-in (wall / tokens)"]
        lines += [
            "Cost per generated token, ms (timers inside the server; at N streams a step "
            "serves N tokens, so per-token figures are the step's share):",
            "",
            "| component | "
            + " | ".join(f"{lv.mode} c{lv.concurrency}" for lv in cost_levels)
            + " |",
            "|---" * (len(cost_levels) + 1) + "|",
        ]
        for label in labels:
            cells = " | ".join(f"{lv.cost_ms.get(label, float('nan')):.2f}" for lv in cost_levels)
            lines.append(f"| {label} | {cells} |")
        ratio = " | ".join(
            f"{lv.cost_ms['all-in (wall / tokens)'] / lv.cost_ms['GPT step (decode + prefill)']:.2f}"
            for lv in cost_levels
        )
        lines += [f"| all-in / GPT step | {ratio} |", ""]
    text = "\n".join(lines)
    # Written whole, then renamed: a run killed mid-write still leaves the previous report.
    (out / "serving.md.tmp").write_text(text)
    (out / "serving.md.tmp").replace(out / "serving.md")
    if ours:
        plot(args, up, ours, out / "serving.tmp.png")
        (out / "serving.tmp.png").replace(out / "serving.png")
    return text


def plot(args: argparse.Namespace, up: Level | None, ours: list[Level], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    panels = [
        ("TTFA p50 (s)", lambda lv: pct(lv.ttfa_s, 50)),
        ("gap-free start p50 (s)", lambda lv: pct(lv.gap_free_s, 50)),
        ("RTF p50 per stream", lambda lv: pct(lv.rtf, 50)),
        ("audio s per wall s", lambda lv: lv.throughput),
    ]
    for ax, (title, value) in zip(axes, panels, strict=True):
        for mode in dict.fromkeys(lv.mode for lv in ours):
            levels = [lv for lv in ours if lv.mode == mode]
            ax.plot(
                [lv.concurrency for lv in levels], [value(lv) for lv in levels], "o-", label=mode
            )
        if up:
            ax.axhline(value(up), color="r", ls=":", label="upstream (sequential)")
        if "RTF" in title:
            ax.axhline(1.0, color="k", ls="--", lw=0.8)
        cs = sorted({lv.concurrency for lv in ours})
        ax.set(xscale="log", xlabel="concurrent streams", title=title)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{args.tokens}-token streams, {args.model} dev model, {args.device}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200, help="audio tokens per stream")
    parser.add_argument("--requests", type=int, default=16, help="requests per level (>= c)")
    parser.add_argument(
        "--upstream-requests", type=int, default=3, help="sequential upstream requests (and c1)"
    )
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument(
        "--modes",
        default="default",
        help="servers to run, in turn: default (the server's default flags), gguf:<format>",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat each level, the transports taking turns"
    )
    parser.add_argument(
        "--transports",
        default="grpc",
        help="front doors to drive, each level in turn on the same server: grpc (the client "
        "library), http (POST /v1/audio/speech, pcm) or grpc,http",
    )
    parser.add_argument("--max-streams", type=int, default=16)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="server device")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "float16", "bfloat16"],
        help="the server's GPT dtype on CUDA (a CPU serves llama.cpp's GGUF format)",
    )
    parser.add_argument("--model", default="full", choices=["tiny", "full"])
    parser.add_argument("--skip-upstream", action="store_true")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra chattts-server flag (repeatable)"
    )
    parser.add_argument("--server-timeout", type=float, default=600)
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument(
        "--logs", help="folder for the server logs and timer dumps (default: a temporary one)"
    )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=float("inf"),
        help="start no load level after this many seconds (the report says which were skipped)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, few tokens, output to a temp folder"
    )
    args = parser.parse_args()
    if args.smoke:
        args.model, args.tokens, args.requests, args.upstream_requests = "tiny", 24, 2, 1
        args.concurrency, args.max_streams, args.modes = "1,2", 2, "default"
        args.transports = "grpc,http"
        args.out = tempfile.mkdtemp(prefix="bench_serving-")

    from chattts_server.devmodel.assets import build_dev_assets

    deadline = time.monotonic() + args.time_budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache)
    model_dir = Path(build_dev_assets(args.model, cache))
    ours: list[Level] = []
    # Server logs and timer dumps: not the committed results.
    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench_serving-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"server logs in {logs}", flush=True)
    up = None
    if not args.skip_upstream:
        print("(b) upstream ChatTTS, stream mode, sequential (measured first)", flush=True)
        up = run_upstream(model_dir, args.device, args.tokens, args.upstream_requests)
        write_report(args, up, ours, out)

    def on_level(level: Level | None) -> None:
        if level is not None:
            ours.append(level)
        write_report(args, up, ours, out)  # as each level ends: a timeout keeps what ran

    for mode in [m for m in args.modes.split(",") if m]:
        print(f"(a) our server, {mode}", flush=True)
        run_mode(args, mode, cache, logs, on_level, deadline)
    print(write_report(args, up, ours, out))
    print(f"wrote {out / 'serving.md'} and {out / 'serving.png'}")


if __name__ == "__main__":
    main()
