"""Soak test: many short streams, a share cancelled after the first chunk; nothing may leak.

    python bench/soak.py [--streams 2000 --concurrency 16 --cancel-fraction 0.3 --tokens 8]
    python bench/soak.py --smoke   # 24 streams of 4 tokens: checks the script, measures nothing

Starts `chattts-server` (tiny model, --max-streams 16 --max-queue 64, metrics on) as a subprocess,
drives it through `AsyncTTSClient`, and reports the server's active slots and streams
(Prometheus endpoint), open fds, threads and RSS (/proc/<pid>) before and after, and the calls'
statuses. Exits 1 if slots or streams stay above zero or fds grow by more than a few.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
import sys
import time
from pathlib import Path

from _common import CACHE, Call, arguments, gauges, launch, load_line, proc_mib, run_load

from chattts_client import AsyncTTSClient
from chattts_proto.chattts.v1 import tts_pb2

GAUGES = ("chattts_kv_slots_in_use", "chattts_active_streams", "chattts_queued_streams")


def proc_figures(pid: int) -> dict[str, float]:
    threads = re.search(r"Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(threads.group(1)) if threads else float("nan"),
        "rss_mib": proc_mib(pid),
    }


def settle(port: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's gauges once no stream is active or queued (or whatever they are at timeout):
    cancelled streams free their slots asynchronously."""
    deadline = time.monotonic() + timeout_s
    while True:
        figures = gauges(port, GAUGES)
        if not any(figures.values()) or time.monotonic() > deadline:
            return figures
        time.sleep(0.1)


async def one_stream(client: AsyncTTSClient, i: int, tokens: int, cancel: bool) -> Call:
    """One stream; cancelled by the client after its first event when `cancel`."""
    config = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1000 + i % 7),
        sampling=tts_pb2.Sampling(seed=i, min_new_tokens=tokens, max_new_tokens=tokens),
    )
    stream = client.synthesize(f"Soak stream {i}.", config=config, timeout=120)
    call = Call()
    try:
        async for _ in stream:
            if cancel:
                stream.cancel()
                break
        call.status = (await stream.call.code()).name
    except asyncio.CancelledError:
        call.status = "CANCELLED(client)"
    except Exception as exc:  # noqa: BLE001 - grpc.aio.AioRpcError and the like, counted
        code = getattr(exc, "code", None)
        call.status = code().name if callable(code) else type(exc).__name__
    return call


def drive(target: str, streams: int, concurrency: int, cancel_fraction: float, tokens: int) -> dict:
    """The calls' status codes, counted."""
    rng = random.Random(0)
    cancels = [rng.random() < cancel_fraction for _ in range(streams)]

    async def go() -> list[Call]:
        async with AsyncTTSClient(target) as client:
            load = await run_load(
                concurrency, streams, lambda i: one_stream(client, i, tokens, cancels[i])
            )
        return load.calls

    return dict(sorted(collections.Counter(call.status for call in asyncio.run(go())).items()))


def main() -> int:
    # fmt: off
    p = arguments(__doc__, "a few seconds: 24 streams of 4 tokens, no warm-up")
    p.add_argument("--streams", type=int, default=2000, help="streams to run (%(default)s)")
    p.add_argument("--concurrency", type=int, default=16, help="streams open at once (%(default)s)")
    p.add_argument("--cancel-fraction", type=float, default=0.3, help="share of streams cancelled after their first chunk (%(default)s)")
    p.add_argument("--tokens", type=int, default=8, help="audio tokens per stream (%(default)s)")
    p.add_argument("--cache", default=str(CACHE), help="dev-model cache folder (%(default)s)")
    # fmt: on
    a = p.parse_args()
    server_args = ["--max-streams", "16", "--max-queue", "64", "--log-level", "WARNING"]
    if a.smoke:
        a.streams, a.concurrency, a.tokens = 24, 8, 4
        server_args.append("--no-warmup")
    with launch(server_args, dev_model="tiny", cache=a.cache, metrics=True) as srv:
        srv.wait_serving()
        # A few streams first so lazily created threads and buffers exist before the baseline.
        drive(srv.target, 16, 16, 0.0, a.tokens)
        gauges_before, before = settle(srv.metrics_port), proc_figures(srv.pid)
        started = time.monotonic()
        codes = drive(srv.target, a.streams, a.concurrency, a.cancel_fraction, a.tokens)
        wall_s = time.monotonic() - started
        gauges, after = settle(srv.metrics_port), proc_figures(srv.pid)
        rc = srv.stop(timeout_s=60)
    print(f"streams={a.streams} concurrency={a.concurrency} cancel_fraction={a.cancel_fraction} "
          f"tokens={a.tokens}; {load_line()}")  # fmt: skip
    print(f"wall_s={wall_s:.1f} streams_per_s={a.streams / wall_s:.1f}\nstatus codes: {codes}")
    for key in before:
        delta = after[key] - before[key]
        print(f"server {key}: before={before[key]:.1f} after={after[key]:.1f} delta={delta:+.1f}")
    for key in gauges:
        print(f"{key}: before={gauges_before[key]:g} after={gauges[key]:g}")
    print(f"server exit code after SIGTERM: {rc}")
    leaked = gauges["chattts_kv_slots_in_use"] != 0 or gauges["chattts_active_streams"] != 0
    leaked = leaked or after["fds"] - before["fds"] > 4 or rc != 0
    print("RESULT:", "LEAK/FAIL" if leaked else "OK")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
