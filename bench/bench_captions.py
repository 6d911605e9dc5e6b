"""Live captions read aloud: time to first audio for words without punctuation.

The caption pattern of issue 11: N ASR words with no punctuation, one every `--interval-ms`,
through StreamingSynthesize on one stream, the client half-closing only after the last word.
Measured from the first word leaving the client:
  - time to first audio (the target is 1.5 s on the tiny model),
  - how many utterances ended, and how much audio arrived, while the stream was still open,
  - when the last audio arrived after the half-close.

The server is `chattts-server` (a subprocess, tiny random-weight dev model unless --model-dir or
--target), talked to with the generated stubs over loopback. Random weights: the model speaks no
words, but time to first audio does not depend on weight values. Prints its figures; writes
nothing.

Usage: python bench/bench_captions.py [--words 60] [--interval-ms 150] [--runs 3]
       [--first-words 4] [--max-words 20] [--idle-ms 600] [--max-new-tokens 200]
       [--target HOST:PORT | --dev-model tiny|full | --model-dir DIR] [--device cpu|cuda]
       python bench/bench_captions.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

import grpc  # noqa: E402

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402

CAPTION_TEXT = (
    "so what we are seeing here is that the traffic on the ring road is building up again "
    "and if you are heading into the city this evening you should expect delays of around "
    "twenty minutes near the bridge where the right lane is still closed for repairs so "
    "consider taking the northern route instead"
)
CAPTION = CAPTION_TEXT.split()


@dataclass
class Run:
    ttfa_s: float | None = None
    utterances_while_open: int = 0
    audio_s_while_open: float = 0.0
    last_audio_after_close_s: float = 0.0
    texts: list[str] = field(default_factory=list)


def words(count: int) -> list[str]:
    return [CAPTION[i % len(CAPTION)] for i in range(count)]


async def one_run(stub: tts_pb2_grpc.TextToSpeechStub, args: argparse.Namespace) -> Run:
    run = Run()
    config = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=1, max_new_tokens=args.max_new_tokens),
        text_release=tts_pb2.TextReleasePolicy(
            first_words=args.first_words, max_words=args.max_words, idle_ms=args.idle_ms
        ),
    )
    started: float | None = None
    closed_at: float | None = None

    async def requests():  # type: ignore[no-untyped-def]
        nonlocal started, closed_at
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        for i, word in enumerate(words(args.words)):
            if i:
                await asyncio.sleep(args.interval_ms / 1000)  # the caption's own pace
            if started is None:
                started = time.monotonic()
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=word + " "))
        closed_at = time.monotonic()

    async for reply in stub.StreamingSynthesize(requests(), timeout=args.timeout_s):
        now = time.monotonic()
        if reply.HasField("audio"):
            if run.ttfa_s is None and started is not None:
                run.ttfa_s = now - started
            if closed_at is None:
                run.audio_s_while_open += reply.audio.num_samples / reply.audio.sample_rate_hz
        else:
            run.texts.append(reply.utterance_end.text)
            if closed_at is None:
                run.utterances_while_open += 1
        if closed_at is not None:
            run.last_audio_after_close_s = now - closed_at
    return run


async def measure(target: str, args: argparse.Namespace) -> list[Run]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        await one_run(stub, argparse.Namespace(**{**vars(args), "words": 6}))  # warm the path
        return [await one_run(stub, args) for _ in range(args.runs)]


def report(args: argparse.Namespace, runs: list[Run]) -> None:
    ttfas = [r.ttfa_s for r in runs if r.ttfa_s is not None]
    span_s = (args.words - 1) * args.interval_ms / 1000
    print(
        f"caption pattern: {args.words} words without punctuation, one every "
        f"{args.interval_ms} ms ({span_s:.1f} s), policy first_words={args.first_words} "
        f"max_words={args.max_words} idle_ms={args.idle_ms}, {len(runs)} run(s)"
    )
    for i, r in enumerate(runs):
        ttfa = "none" if r.ttfa_s is None else f"{r.ttfa_s:.3f} s"
        print(
            f"run {i}: first audio {ttfa} after the first word; {r.utterances_while_open} of "
            f"{len(r.texts)} utterances ended and {r.audio_s_while_open:.1f} s of audio arrived "
            f"while the stream was open; last audio {r.last_audio_after_close_s:.2f} s after "
            "the half-close"
        )
    if ttfas:
        print(
            f"RESULT: time to first audio median {statistics.median(ttfas):.3f} s, "
            f"max {max(ttfas):.3f} s (target 1.5 s)"
        )
    else:
        print("RESULT: no audio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--interval-ms", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-words", type=int, default=4)
    parser.add_argument("--max-words", type=int, default=20)
    parser.add_argument("--idle-ms", type=int, default=600)
    parser.add_argument(
        "--max-new-tokens", type=int, default=200, help="audio tokens per utterance at most"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--target", help="an already running server; else one is started")
    parser.add_argument("--dev-model", default="tiny", help="random-weight model: tiny or full")
    parser.add_argument("--model-dir", help="real weights instead of a dev model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--smoke", action="store_true", help="12 words, one run: checks the script works"
    )
    args = parser.parse_args()
    if args.smoke:
        args.words, args.runs, args.max_new_tokens = 12, 1, 30

    from chattts_devtools.launcher import bench_server

    with bench_server(args) as target:
        runs = asyncio.run(measure(target, args))
    report(args, runs)
    if not any(r.ttfa_s is not None for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
