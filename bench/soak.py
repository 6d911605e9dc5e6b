"""Soak test: many short streams, a share cancelled after the first chunk; nothing may leak.

    python bench/soak.py [--streams 2000 --concurrency 16 --cancel-fraction 0.3 --tokens 8]

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
import socket
import sys
import time
import urllib.request
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "client"), str(REPO / "server")]

from chattts_client._proto.chattts.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402
from serverutil import start_server_process, wait_serving  # noqa: E402

CACHE = REPO / ".cache" / "dev-models"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cancel-fraction", type=float, default=0.3)
    p.add_argument("--tokens", type=int, default=8)
    a = p.parse_args()

    from chattts_server.model.assets import build_dev_assets

    build_dev_assets("tiny", CACHE)
    mport = free_port()
    proc, port = start_server_process(
        [
            "--max-streams",
            "16",
            "--max-queue",
            "64",
            "--metrics-port",
            str(mport),
            "--log-level",
            "WARNING",
        ],
        CACHE,
    )
    target = f"127.0.0.1:{port}"
    try:
        wait_serving(target)
        # A few streams first so lazily created threads and buffers exist before the baseline.
        asyncio.run(drive(target, 16, 16, 0.0, a.tokens))
        time.sleep(1)
        before, m_before = proc_figures(proc.pid), metrics(mport)
        started = time.monotonic()
        codes = asyncio.run(drive(target, a.streams, a.concurrency, a.cancel_fraction, a.tokens))
        wall = time.monotonic() - started
        time.sleep(2)  # let cancelled streams settle
        after, m_after = proc_figures(proc.pid), metrics(mport)
    finally:
        proc.terminate()
        rc = proc.wait(60)

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
