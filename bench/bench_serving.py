"""Serving benchmark: upstream ChatTTS stream mode vs our gRPC server, on the full-size dev model.

In one process:
  (a) upstream `Chat.infer(text, stream=True, skip_refine_text=True)`, sequential requests of
      exactly T tokens (min = max new tokens): time to first audio, total time;
  (b) our server (`chattts_server.main`, a subprocess) through the real client library
      (`chattts_client.AsyncTTSClient`) at each concurrency: TTFA p50/p95, per-stream RTF,
      aggregate audio seconds per wall second, and ratios vs upstream;
  (c) one decode step of our LlamaDecoder vs a bare transformers LlamaModel (bench_decode_step).
Writes <out>/serving.md and <out>/serving.png.

Random weights at the official shapes: timings do not depend on weight values. Compare ratios
measured in one run; a shared machine makes absolute times noisy.

Usage: python bench/bench_serving.py [--tokens 200] [--requests 16] [--upstream-requests 3]
       [--concurrency 1,4,16] [--device cpu|cuda] [--dtype float32|bfloat16|float16]
       [--decode-batches 1,4,16] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "bench")]

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


def text_for(i: int) -> str:
    words = [TEXT_WORDS[(i + k) % len(TEXT_WORDS)] for k in range(8)]
    return "this is request " + " ".join(words) + "."


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


@dataclass
class Level:
    name: str
    concurrency: int
    ttfa_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    audio_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0

    @property
    def rtf(self) -> list[float]:
        return [t / a for t, a in zip(self.total_s, self.audio_s, strict=True) if a > 0]

    @property
    def throughput(self) -> float:
        """Audio seconds generated per wall second, all streams together."""
        return sum(self.audio_s) / self.wall_s if self.wall_s else float("nan")


# -- (a) upstream -----------------------------------------------------------------------------


def run_upstream(model_dir: Path, device: str, tokens: int, requests: int) -> Level:
    import torch
    from ChatTTS import Chat

    from chattts_server.model.loader import upstream_chat

    chat = upstream_chat(model_dir, torch.device(device))
    torch.manual_seed(2)
    spk = chat.sample_random_speaker()
    params = Chat.InferCodeParams(
        spk_emb=spk, min_new_token=tokens, max_new_token=tokens, show_tqdm=False, manual_seed=0
    )
    level = Level("upstream stream", 1)

    def one(i: int) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        first, samples = None, 0
        for wav in chat.infer(
            text_for(i), stream=True, skip_refine_text=True, params_infer_code=params
        ):
            n = int(np.asarray(wav).size) if wav is not None else 0
            if n and first is None:
                first = time.perf_counter() - t0
            samples += n
        total = time.perf_counter() - t0
        return first if first is not None else total, total, samples / 24000

    one(999)  # warm-up (not timed)
    start = time.perf_counter()
    for i in range(requests):
        ttfa, total, audio = one(i)
        level.ttfa_s.append(ttfa)
        level.total_s.append(total)
        level.audio_s.append(audio if audio > 0 else tokens / TOKENS_PER_S)
        print(
            f"  upstream #{i}: ttfa {ttfa:.2f} s, total {total:.2f} s, audio {audio:.2f} s",
            flush=True,
        )
    level.wall_s = time.perf_counter() - start
    return level


# -- (b) our server ---------------------------------------------------------------------------


def start_server(args: argparse.Namespace, cache: Path) -> tuple[subprocess.Popen[str], int]:
    max_tokens = max(1024, args.tokens + 256)
    cmd = [
        sys.executable, "-m", "chattts_server.main",
        "--host", "127.0.0.1", "--port", "0",
        "--dev-model", "full", "--dev-model-cache", str(cache),
        "--device", args.device, "--dtype", args.dtype,
        "--max-streams", str(args.max_streams),
        "--max-tokens", str(max_tokens), "--max-new-tokens", str(max_tokens - 128),
        "--max-queue", str(max(64, args.requests * 2)),
        *args.server_arg,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO / 'server'}"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env
    )
    assert proc.stdout is not None
    deadline, lines = time.monotonic() + args.server_timeout, []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on port (\d+)", line)
        if m:
            log = open(Path(args.out) / "server.log", "w")  # noqa: SIM115 - closed by drain()
            log.writelines(lines)

            def drain(log=log) -> None:  # type: ignore[no-untyped-def]
                for rest in proc.stdout:  # type: ignore[union-attr]
                    log.write(rest)
                log.close()

            threading.Thread(target=drain, daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError("server did not start:\n" + "".join(lines[-40:]))


def wait_serving(target: str, timeout_s: float) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"{target} not SERVING after {timeout_s} s")


async def run_ours_level(
    target: str, concurrency: int, requests: int, tokens: int, base: int
) -> Level:
    from chattts_client import AsyncTTSClient
    from chattts_client._proto.chattts.v1 import tts_pb2

    level = Level(f"ours c{concurrency}", concurrency)
    sem = asyncio.Semaphore(concurrency)
    client = AsyncTTSClient(target)

    async def one(i: int) -> None:
        config = tts_pb2.SynthesisConfig(
            voice=tts_pb2.Voice(seed=2),
            sampling=tts_pb2.Sampling(seed=base + i, min_new_tokens=tokens, max_new_tokens=tokens),
        )
        async with sem:
            try:
                stream = client.synthesize(text_for(base + i), config=config, timeout=600)
                async for _ in stream:
                    pass
            except Exception as exc:  # noqa: BLE001 - counted and reported
                level.errors += 1
                print(f"  request {i} failed: {exc!r}"[:300], flush=True)
                return
            s = stream.stats
            level.ttfa_s.append((s.ttfa_ms or 0.0) / 1000)
            level.total_s.append(s.total_s)
            level.audio_s.append(s.audio_s)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    level.wall_s = time.perf_counter() - start
    await client.close()
    return level


def run_ours(args: argparse.Namespace, cache: Path, levels: list[int]) -> list[Level]:
    proc, port = start_server(args, cache)
    target = f"127.0.0.1:{port}"
    results = []
    try:
        wait_serving(target, args.server_timeout)
        asyncio.run(run_ours_level(target, 1, 1, min(args.tokens, 24), 10_000))  # warm the path
        for c in levels:
            n = (
                max(args.requests, c)
                if c > 1
                else max(1, min(args.requests, args.upstream_requests))
            )
            level = asyncio.run(run_ours_level(target, c, n, args.tokens, 1000 * c))
            print(
                f"  ours c{c}: {n} requests, wall {level.wall_s:.1f} s, ttfa p50 {pct(level.ttfa_s, 50):.2f} s, "
                f"{level.throughput:.2f} audio s/s, errors {level.errors}",
                flush=True,
            )
            results.append(level)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return results


# -- (c) decode step --------------------------------------------------------------------------


def run_decode_step(
    model_dir: Path, device: str, dtype_name: str, batches: list[int], steps: int
) -> list[tuple[int, float, float]]:
    import torch
    from bench_decode_step import _bare_step, _interleaved_ms, _ours_step
    from transformers import LlamaConfig, LlamaModel

    from chattts_server.model.llama import LlamaDecoder, LlamaShape, SlotKVCache

    dev, dtype = torch.device(device), getattr(torch, dtype_name)
    config = LlamaConfig.from_json_file(str(model_dir / "asset" / "gpt" / "config.json"))
    torch.manual_seed(0)
    model = LlamaModel(config).to(device=dev, dtype=dtype).eval()
    decoder = LlamaDecoder.from_state_dict(config, model.state_dict(), dev, dtype)
    context = 100
    cache = SlotKVCache(
        LlamaShape.from_config(config), max(batches), context + context // 10 + 2, dev, dtype
    )
    rows = []
    with torch.inference_mode():
        for b in batches:
            ms = _interleaved_ms(
                {
                    "bare": _bare_step(model, b, context),
                    "ours": _ours_step(decoder, cache, list(range(b)), context),
                },
                steps,
                dev,
            )
            rows.append((b, ms["bare"], ms["ours"]))
            print(
                f"  decode step B={b}: bare {ms['bare']:.1f} ms, ours {ms['ours']:.1f} ms",
                flush=True,
            )
    return rows


# -- report -----------------------------------------------------------------------------------


def write_report(
    args: argparse.Namespace,
    up: Level | None,
    ours: list[Level],
    decode: list[tuple[int, float, float]],
    out: Path,
) -> str:
    lines = [
        "# Serving benchmark",
        "",
        f"Full-size dev model (random weights), {args.device}/{args.dtype}, {args.tokens} tokens per stream "
        f"({args.tokens / TOKENS_PER_S:.2f} s of audio), server --max-streams {args.max_streams}. "
        f"Command: `{' '.join(sys.argv)}`",
        "",
        "| run | streams | requests | TTFA p50 s | TTFA p95 s | RTF p50 (per stream) | audio s / wall s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lv in ([up] if up else []) + ours:
        lines.append(
            f"| {lv.name} | {lv.concurrency} | {len(lv.total_s)} | {pct(lv.ttfa_s, 50):.2f} | {pct(lv.ttfa_s, 95):.2f} "
            f"| {pct(lv.rtf, 50):.2f} | {lv.throughput:.2f} | {lv.errors} |"
        )
    lines.append("")
    if up and ours:
        c1 = next((lv for lv in ours if lv.concurrency == 1), None)
        top = max(ours, key=lambda lv: lv.concurrency)
        if c1 and c1.ttfa_s:
            lines.append(
                f"- TTFA at c1 vs upstream stream mode: {pct(c1.ttfa_s, 50):.2f} s vs {pct(up.ttfa_s, 50):.2f} s "
                f"(**{pct(up.ttfa_s, 50) / pct(c1.ttfa_s, 50):.1f}x** sooner)"
            )
        lines.append(
            f"- Throughput at c{top.concurrency} vs upstream sequential: {top.throughput:.2f} vs {up.throughput:.2f} "
            f"audio s per wall s (**{top.throughput / up.throughput:.1f}x**)"
        )
        lines.append("")
    if decode:
        lines += [
            "Decode step (20-layer GPT, context 100, median):",
            "",
            "| batch | transformers LlamaModel ms | our LlamaDecoder ms | ours / bare |",
            "|---|---|---|---|",
        ]
        lines += [f"| {b} | {bare:.1f} | {o:.1f} | {o / bare:.2f} |" for b, bare, o in decode]
        lines.append("")
    text = "\n".join(lines)
    (out / "serving.md").write_text(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    cs = [lv.concurrency for lv in ours]
    ax1.plot(cs, [pct(lv.ttfa_s, 50) for lv in ours], "o-", label="ours p50")
    ax1.plot(cs, [pct(lv.ttfa_s, 95) for lv in ours], "o--", label="ours p95")
    ax2.plot(cs, [lv.throughput for lv in ours], "o-", label="ours")
    if up:
        ax1.axhline(pct(up.ttfa_s, 50), color="r", ls=":", label="upstream stream (sequential)")
        ax2.axhline(up.throughput, color="r", ls=":", label="upstream (sequential)")
    ax1.set(
        xscale="log", xlabel="concurrent streams", ylabel="time to first audio (s)", title="TTFA"
    )
    ax2.set(
        xscale="log", xlabel="concurrent streams", ylabel="audio s per wall s", title="Throughput"
    )
    for ax in (ax1, ax2):
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{args.tokens}-token streams, {args.device}/{args.dtype}")
    fig.tight_layout()
    fig.savefig(out / "serving.png", dpi=110)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, default=200, help="audio tokens per stream (min = max)"
    )
    parser.add_argument(
        "--requests", type=int, default=16, help="requests per concurrency level (at least c)"
    )
    parser.add_argument(
        "--upstream-requests",
        type=int,
        default=3,
        help="sequential upstream requests (and ours at c1)",
    )
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-streams", type=int, default=16)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--upstream-device", default=None, help="default: --device (upstream runs fp32 weights)"
    )
    parser.add_argument("--decode-batches", default="1,4,16", help="empty to skip (c)")
    parser.add_argument("--decode-steps", type=int, default=10)
    parser.add_argument("--skip-upstream", action="store_true")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra chattts-server flag (repeatable)"
    )
    parser.add_argument("--server-timeout", type=float, default=600)
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = parser.parse_args()

    from chattts_server.model.dev_assets import build_dev_assets

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache)
    t = time.perf_counter()
    model_dir = Path(build_dev_assets("full", cache))
    print(f"full dev model at {model_dir} ({time.perf_counter() - t:.1f} s)", flush=True)
    levels = [int(c) for c in args.concurrency.split(",") if c]

    print("(b) our server", flush=True)
    ours = run_ours(args, cache, levels)  # first: the server subprocess then has the CPU to itself
    up = None
    if not args.skip_upstream:
        print("(a) upstream ChatTTS, stream mode, sequential", flush=True)
        up = run_upstream(
            model_dir, args.upstream_device or args.device, args.tokens, args.upstream_requests
        )
    decode = []
    if args.decode_batches:
        print("(c) decode step", flush=True)
        batches = [int(b) for b in args.decode_batches.split(",") if b]
        decode = run_decode_step(model_dir, args.device, args.dtype, batches, args.decode_steps)
    print(write_report(args, up, ours, decode, out))


if __name__ == "__main__":
    main()
