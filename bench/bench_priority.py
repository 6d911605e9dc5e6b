"""Priority classes under a caption backlog: navigation prompts' first audio, idle vs loaded.

The pattern of issue 29: `--bulk` caption streams (StreamingSynthesize, PRIORITY_BULK, ASR
words without punctuation at `--word-interval-ms`) hold every place but the reserved one
(`--max-streams bulk + reserved`, `--reserved-slots reserved`), and a navigation prompt
(Synthesize, PRIORITY_INTERACTIVE) arrives every `--prompt-interval-s`. In one run, one server:
  1. idle: `--prompts` prompts on the idle server, one per interval: time to first audio;
  2. bulk only: the caption streams for `--window-s`: the audio seconds they receive per wall
     second (all streams together) and their chunk-gap p95;
  3. bulk + prompts: the same caption streams while `--prompts` prompts arrive, one per interval:
     the prompts' first audio, and what the bulk streams lose (audio rate and gaps against 2).
Reports p50/p95 of the prompts' first audio loaded against idle (the target: p95 <= 1.5x idle).

The server is `chattts-server` (a subprocess, tiny random-weight dev model unless --dev-model
full or --model-dir), talked to with the generated stubs over loopback. Prints its figures;
writes nothing.

Usage: python bench/bench_priority.py [--bulk 16] [--reserved 2] [--prompts 10]
       [--prompt-interval-s 2] [--window-s 20] [--word-interval-ms 150]
       [--dev-model tiny|full | --model-dir DIR] [--server-arg=--gguf-format=F16 ...]
       python bench/bench_priority.py --smoke    # 3 caption streams, 3 prompts, short windows
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

import grpc  # noqa: E402

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402

CAPTION_TEXT = (
    "so what we are seeing here is that the traffic on the ring road is building up again "
    "and if you are heading into the city this evening you should expect delays of around "
    "twenty minutes near the bridge where the right lane is still closed for repairs"
)
CAPTION = CAPTION_TEXT.split()
PROMPTS = [
    "In three hundred metres, turn left onto Station Road.",
    "Keep right at the fork.",
    "Take the second exit at the roundabout.",
    "Your destination is on the left.",
]


@dataclass
class BulkStream:
    """One caption stream's audio as it arrived: (arrival time, audio seconds) per chunk."""

    chunks: list[tuple[float, float]] = field(default_factory=list)
    error: str = ""

    def audio_s(self, start: float, end: float) -> float:
        return sum(a for t, a in self.chunks if start <= t < end)

    def gaps(self, start: float, end: float) -> list[float]:
        times = [t for t, _ in self.chunks if start <= t < end]
        return list(np.diff(times)) if len(times) > 1 else []


async def caption_stream(
    stub: tts_pb2_grpc.TextToSpeechStub,
    args: argparse.Namespace,
    stop: asyncio.Event,
    record: BulkStream,
    index: int,
) -> None:
    """Caption words at their own pace until `stop`, then half-close and read the rest."""
    config = tts_pb2.SynthesisConfig(
        priority=tts_pb2.PRIORITY_BULK,
        sampling=tts_pb2.Sampling(seed=index, max_new_tokens=args.bulk_max_new_tokens),
        # Captions have no punctuation: release every few words, as bench_captions.py does.
        text_release=tts_pb2.TextReleasePolicy(first_words=4, max_words=12, idle_ms=600),
    )

    async def requests():  # type: ignore[no-untyped-def]
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        i = index * 7  # streams start at different words
        while not stop.is_set():
            word = CAPTION[i % len(CAPTION)]
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=word + " "))
            i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.word_interval_ms / 1000)

    try:
        async for reply in stub.StreamingSynthesize(requests(), timeout=args.timeout_s):
            if reply.HasField("audio"):
                seconds = reply.audio.num_samples / reply.audio.sample_rate_hz
                record.chunks.append((time.monotonic(), seconds))
    except grpc.aio.AioRpcError as exc:
        record.error = f"{exc.code().name}: {exc.details()}"


async def prompt(stub: tts_pb2_grpc.TextToSpeechStub, args: argparse.Namespace, i: int) -> float:
    """One navigation prompt; seconds from the call to its first audio chunk."""
    request = tts_pb2.SynthesizeRequest(
        text=PROMPTS[i % len(PROMPTS)],
        config=tts_pb2.SynthesisConfig(
            priority=tts_pb2.PRIORITY_INTERACTIVE,
            sampling=tts_pb2.Sampling(seed=i, max_new_tokens=args.prompt_max_new_tokens),
        ),
    )
    started = time.monotonic()
    first: float | None = None
    async for reply in stub.Synthesize(request, timeout=args.timeout_s):
        if first is None and reply.HasField("audio"):
            first = time.monotonic() - started
    if first is None:
        raise RuntimeError(f"prompt {i} got no audio")
    return first


async def prompts_every(
    stub: tts_pb2_grpc.TextToSpeechStub, args: argparse.Namespace
) -> list[float]:
    """`--prompts` prompts, one starting every interval (they may overlap); their TTFAs."""
    tasks = []
    for i in range(args.prompts):
        if i:
            await asyncio.sleep(args.prompt_interval_s)
        tasks.append(asyncio.create_task(prompt(stub, args, i)))
    return list(await asyncio.gather(*tasks))


@dataclass
class Figures:
    idle_ttfa: list[float]
    loaded_ttfa: list[float]
    bulk: list[BulkStream]
    bulk_only: tuple[float, float]
    with_prompts: tuple[float, float]


async def measure(target: str, args: argparse.Namespace) -> Figures:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        await prompt(stub, args, 0)  # warm the path
        idle = await prompts_every(stub, args)
        stop = asyncio.Event()
        bulk = [BulkStream() for _ in range(args.bulk)]
        streams = [
            asyncio.create_task(caption_stream(stub, args, stop, b, i)) for i, b in enumerate(bulk)
        ]
        await asyncio.sleep(args.settle_s)  # every caption stream is speaking
        t0 = time.monotonic()
        await asyncio.sleep(args.window_s)
        t1 = time.monotonic()
        loaded = await prompts_every(stub, args)
        t2 = time.monotonic()
        stop.set()
        await asyncio.gather(*streams)
    return Figures(idle, loaded, bulk, (t0, t1), (t1, t2))


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def report(args: argparse.Namespace, f: Figures) -> None:
    errors = [b.error for b in f.bulk if b.error]
    print(
        f"{args.bulk} bulk caption streams (one word every {args.word_interval_ms} ms) on "
        f"--max-streams {args.bulk + args.reserved} --reserved-slots {args.reserved}; "
        f"{args.prompts} interactive prompts, one every {args.prompt_interval_s:g} s"
    )
    for name, ttfa in (("idle server", f.idle_ttfa), ("under the bulk load", f.loaded_ttfa)):
        print(
            f"prompts' first audio, {name}: p50 {pct(ttfa, 50):.3f} s, p95 {pct(ttfa, 95):.3f} s, "
            f"max {max(ttfa):.3f} s"
        )
    rates, gaps = [], []
    for start, end in (f.bulk_only, f.with_prompts):
        rates.append(sum(b.audio_s(start, end) for b in f.bulk) / (end - start))
        gaps.append(pct([g for b in f.bulk for g in b.gaps(start, end)], 95))
    print(
        f"bulk streams: {rates[0]:.2f} audio s per s alone ({f.bulk_only[1] - f.bulk_only[0]:.0f} "
        f"s), {rates[1]:.2f} with the prompts ({f.with_prompts[1] - f.with_prompts[0]:.0f} s); "
        f"chunk gap p95 {gaps[0]:.3f} s -> {gaps[1]:.3f} s"
    )
    if errors:
        print(f"bulk stream errors: {errors[:3]}")
    ratio = pct(f.loaded_ttfa, 95) / pct(f.idle_ttfa, 95)
    loss = 1 - rates[1] / rates[0] if rates[0] else float("nan")
    print(
        f"RESULT: prompts' first-audio p95 loaded / idle = {ratio:.2f} (target <= 1.5); "
        f"bulk audio rate lost while prompts run: {100 * loss:.0f}%"
    )


def main() -> None:
    from chattts_devtools.launcher import add_bench_server_arguments, bench_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bulk", type=int, default=16, help="caption streams (PRIORITY_BULK)")
    parser.add_argument("--reserved", type=int, default=2, help="--reserved-slots")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per phase")
    parser.add_argument("--prompt-interval-s", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=20.0, help="bulk-only window")
    parser.add_argument("--settle-s", type=float, default=5.0, help="bulk start-up, unmeasured")
    parser.add_argument("--word-interval-ms", type=int, default=150)
    parser.add_argument("--bulk-max-new-tokens", type=int, default=200)
    parser.add_argument("--prompt-max-new-tokens", type=int, default=120)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    add_bench_server_arguments(parser)
    parser.add_argument(
        "--smoke", action="store_true", help="3 caption streams, 3 prompts, short windows"
    )
    args = parser.parse_args()
    if args.smoke:
        args.bulk, args.prompts, args.prompt_interval_s = 3, 3, 0.5
        args.window_s, args.settle_s, args.bulk_max_new_tokens = 2.0, 2.0, 40
        args.word_interval_ms = 50
        args.prompt_max_new_tokens = 20

    server_args = [
        *("--max-streams", str(args.bulk + args.reserved)),
        *("--reserved-slots", str(args.reserved)),
        *("--max-queue", str(args.bulk + args.prompts)),
    ]
    with bench_server(args, server_args) as target:
        figures = asyncio.run(measure(target, args))
    report(args, figures)


if __name__ == "__main__":
    main()
