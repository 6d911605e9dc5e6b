"""Live captions read aloud: time to first audio, and whether speech keeps up with the captions.

The caption pattern of issue 11: N ASR words with no punctuation, one every `--interval-ms`,
through StreamingSynthesize on one stream, the client half-closing only after the last word.
Measured from the first word leaving the client:
  - time to first audio (the target is 1.5 s on the tiny model),
  - how many utterances ended, and how much audio arrived, while the stream was still open,
  - when the last audio arrived after the half-close.
This mode prints its figures and writes nothing.

With `--feed-rate R`: captions that arrive faster than the voice speaks them. The bench first
measures the voice's rate on this server (words of released utterances per second of their
audio, from a calibration stream fed the run's first `--calibration-words` words at once), then
feeds caption words (no punctuation, one message per word, evenly spaced) at R x that rate for
`--duration-s`, once without `SynthesisConfig.max_lag_s` and once with `--max-lag-s`, each on a
fresh stream. The client plays the audio in real time on a playout clock (the first chunk starts
playback, each chunk plays once the one before it has ended; nothing sleeps), and records per
utterance the lag it hears (the playout time of the utterance's first sample minus the send
time of its first word, found from UtteranceEnd.source_start) beside the server's
UtteranceEnd.lag_s, speed and finish_reason. Writes bench/results/captions_lag.png (lag over
the run, both runs, the soft and hard limits drawn) and bench/results/captions.md, or
`--out-dir`. The load average (1, 5, 15 min) is printed beside every figure.

The server is `chattts-server` (a subprocess, tiny random-weight dev model unless --model-dir or
--target), talked to with the generated stubs over loopback. Random weights: the model speaks no
words, so an utterance's length is set by sampling (between --min-new-tokens and
--max-new-tokens audio tokens), not by its text or its speed level; time to first audio does
not depend on weight values.

Usage: python bench/bench_captions.py [--words 60] [--interval-ms 150] [--runs 3]
       [--first-words 4] [--max-words 20] [--idle-ms 600] [--max-new-tokens 200]
       [--target HOST:PORT | --dev-model tiny|full | --model-dir DIR] [--device cpu|cuda]
       python bench/bench_captions.py --feed-rate 1.3 [--duration-s 180] [--max-lag-s 4]
       [--hard-lag-s S] [--catch-up-max-speed N] [--max-words 8] [--min-new-tokens 100]
       [--max-new-tokens 200] [--calibration-words 120] [--out-dir DIR]
       python bench/bench_captions.py --smoke   # both modes, a few seconds each; writes nothing
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

sys.path.insert(0, str(REPO / "bench"))
from _caption_feed import (  # noqa: E402
    FeedResult,
    measure_feed,
    plot_feed,
    report_feed,
    words,
    write_feed_md,
)


@dataclass
class Run:
    ttfa_s: float | None = None
    utterances_while_open: int = 0
    audio_s_while_open: float = 0.0
    last_audio_after_close_s: float = 0.0
    texts: list[str] = field(default_factory=list)


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


# --- --feed-rate: captions faster than the voice -------------------------------------------


def main() -> None:
    from chattts_devtools.launcher import add_bench_server_arguments, bench_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--interval-ms", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-words", type=int, default=4)
    parser.add_argument(
        "--max-words", type=int, help="release policy's max_words (default 20; 8 with --feed-rate)"
    )
    parser.add_argument("--idle-ms", type=int, default=600)
    parser.add_argument(
        "--max-new-tokens", type=int, default=200, help="audio tokens per utterance at most"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--feed-rate",
        type=float,
        help="feed captions this many times faster than the voice speaks (the lag mode)",
    )
    parser.add_argument("--duration-s", type=float, default=180.0, help="--feed-rate: feed time")
    parser.add_argument(
        "--max-lag-s", type=float, default=4.0, help="--feed-rate: max_lag_s of the second run"
    )
    parser.add_argument("--hard-lag-s", type=float, help="--feed-rate: hard_lag_s (unset: 2x)")
    parser.add_argument("--catch-up-max-speed", type=int, help="--feed-rate: catch_up_max_speed")
    parser.add_argument(
        "--min-new-tokens",
        type=int,
        default=100,
        help="--feed-rate: audio tokens per utterance at least (random weights sample EOS "
        "anywhere: this keeps the voice's rate steady)",
    )
    parser.add_argument(
        "--calibration-words", type=int, default=120, help="--feed-rate: words measuring the voice"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=REPO / "bench" / "results", help="--feed-rate: results"
    )
    add_bench_server_arguments(parser)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="12 words, one run, then a 3 s feed at 1.3x: checks both modes work; writes nothing",
    )
    args = parser.parse_args()
    feed: argparse.Namespace | None = None
    if args.feed_rate is not None or args.smoke:
        feed = argparse.Namespace(**vars(args))
        feed.max_words = 8 if args.max_words is None else args.max_words
        if args.smoke:
            feed.feed_rate, feed.duration_s, feed.calibration_words = 1.3, 3.0, 16
            feed.max_words, feed.min_new_tokens, feed.max_new_tokens = 4, 20, 30
            feed.max_lag_s = 1.0
        if not 0.5 <= feed.max_lag_s <= 600:
            parser.error("--max-lag-s must be in [0.5, 600]")
    if args.max_words is None:
        args.max_words = 20
    if args.smoke:
        args.words, args.runs, args.max_new_tokens = 12, 1, 30

    runs: list[Run] = []
    result: FeedResult | None = None
    with bench_server(args) as target:
        if args.feed_rate is None:
            runs = asyncio.run(measure(target, args))
            report(args, runs)
        if feed is not None:
            result = asyncio.run(measure_feed(target, feed))
    if feed is not None and result is not None:
        report_feed(feed, result)
        if not args.smoke:
            feed.out_dir.mkdir(parents=True, exist_ok=True)
            png = feed.out_dir / "captions_lag.png"
            plot_feed(feed, result, png)
            write_feed_md(feed, result, feed.out_dir / "captions.md", png)
            print(f"wrote {png} and {feed.out_dir / 'captions.md'}")
    if args.feed_rate is None and not any(r.ttfa_s is not None for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
