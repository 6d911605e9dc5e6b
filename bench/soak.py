"""Soak test: many short streams, a share cancelled after the first chunk; nothing may leak.

    python bench/soak.py [--streams 2000 --concurrency 16 --cancel-fraction 0.3 --tokens 8]
    python bench/soak.py --smoke   # 24 streams of 4 tokens: checks the script, measures nothing

Starts `chattts-server` (tiny model, --max-streams 16 --max-queue 64, metrics on) as a subprocess,
drives it with grpc.aio clients, and reports the server's active slots and streams (Prometheus
endpoint), open fds, threads and RSS (/proc/<pid>) before and after, and error counts by status.
Exits 1 if slots or streams stay above zero or fds grow by more than a few.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import re
import sys
import time
import urllib.request
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

from chattts_devtools.launcher import launch  # noqa: E402
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402

CACHE = REPO / ".cache" / "dev-models"


def proc_figures(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": threads,
        "rss_mib": rss_kib / 1024,
    }


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for name in ("chattts_kv_slots_in_use", "chattts_active_streams", "chattts_queued_streams"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


async def one_stream(stub, i: int, tokens: int, cancel: bool, codes: collections.Counter) -> None:
    cfg = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1000 + i % 7),
        sampling=tts_pb2.Sampling(seed=i, min_new_tokens=tokens, max_new_tokens=tokens),
    )
    call = stub.Synthesize(
        tts_pb2.SynthesizeRequest(text=f"Soak stream {i}.", config=cfg), timeout=120
    )
    try:
        async for _ in call:
            if cancel:
                call.cancel()
                break
        code = await call.code()
        codes[code.name] += 1
    except asyncio.CancelledError:
        codes["CANCELLED(client)"] += 1
    except grpc.aio.AioRpcError as exc:
        codes[exc.code().name] += 1


async def drive(
    target: str, streams: int, concurrency: int, cancel_fraction: float, tokens: int
) -> collections.Counter:
    codes: collections.Counter = collections.Counter()
    rng = random.Random(0)
    sem = asyncio.Semaphore(concurrency)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)

        async def task(i: int) -> None:
            async with sem:
                await one_stream(stub, i, tokens, rng.random() < cancel_fraction, codes)

        await asyncio.gather(*(task(i) for i in range(streams)))
    return codes


def settle(port: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's gauges once no stream is active or queued (or whatever they are at timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        figures = metrics(port)
        if not any(figures.values()) or time.monotonic() > deadline:
            return figures
        time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=2000, help="streams to run (%(default)s)")
    p.add_argument("--concurrency", type=int, default=16, help="streams open at once (%(default)s)")
    p.add_argument(
        "--cancel-fraction",
        type=float,
        default=0.3,
        help="share of streams cancelled after their first chunk (%(default)s)",
    )
    p.add_argument("--tokens", type=int, default=8, help="audio tokens per stream (%(default)s)")
    p.add_argument("--cache", default=str(CACHE), help="dev-model cache folder (%(default)s)")
    p.add_argument(
        "--smoke", action="store_true", help="a few seconds: 24 streams of 4 tokens, no warm-up"
    )
    a = p.parse_args()
    server_args = ["--max-streams", "16", "--max-queue", "64", "--log-level", "WARNING"]
    if a.smoke:
        a.streams, a.concurrency, a.tokens = 24, 8, 4
        server_args.append("--no-warmup")

    from chattts_server.devmodel.assets import build_dev_assets

    build_dev_assets("tiny", a.cache)
    with launch(server_args, dev_model="tiny", cache=a.cache, metrics=True, cwd=REPO) as srv:
        srv.wait_serving()
        # A few streams first so lazily created threads and buffers exist before the baseline.
        asyncio.run(drive(srv.target, 16, 16, 0.0, a.tokens))
        m_before = settle(srv.metrics_port)
        before = proc_figures(srv.pid)
        started = time.monotonic()
        codes = asyncio.run(
            drive(srv.target, a.streams, a.concurrency, a.cancel_fraction, a.tokens)
        )
        wall = time.monotonic() - started
        m_after = settle(srv.metrics_port)  # cancelled streams free their slots asynchronously
        after = proc_figures(srv.pid)
        rc = srv.stop(timeout_s=60)

    print(
        f"streams={a.streams} concurrency={a.concurrency} cancel_fraction={a.cancel_fraction} tokens={a.tokens}"
    )
    print(f"wall_s={wall:.1f} streams_per_s={a.streams / wall:.1f}")
    print("status codes:", dict(sorted(codes.items())))
    for key in before:
        print(
            f"server {key}: before={before[key]:.1f} after={after[key]:.1f} delta={after[key] - before[key]:+.1f}"
        )
    for key in m_before:
        print(f"{key}: before={m_before[key]:g} after={m_after[key]:g}")
    print(f"server exit code after SIGTERM: {rc}")
    leaked = (
        m_after["chattts_kv_slots_in_use"] != 0
        or m_after["chattts_active_streams"] != 0
        or after["fds"] - before["fds"] > 4
        or rc != 0
    )
    print("RESULT:", "LEAK/FAIL" if leaked else "OK")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
