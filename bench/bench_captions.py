"""Live captions read aloud: time to first audio, and whether speech keeps up with the captions.

The caption pattern of issue 11: `--words` ASR words without punctuation, one every
`--interval-ms`, on one PushStream, half-closed after the last. From the first word: time to
first audio (the target is 1.5 s on the tiny model), the utterances ended and the audio received
while the stream was open, and when it ended after the half-close. Prints; writes nothing.

`--feed-rate R`: captions faster than the voice. A calibration stream (the run's first words at
once, same policy and seed) measures the voice's rate; then words are fed at R x that rate for
`--duration-s`, without `SynthesisConfig.max_lag_s` and with `--max-lag-s`, each on a fresh
stream, and per utterance the lag a real-time listener hears (on a playout clock: nothing
sleeps) is held beside the server's lag_s, speed and finish_reason (report_feed says how).
Writes captions.md and captions_lag.png into `--out-dir` (bench/results).

Tiny random-weight dev model unless --model-dir or --target; random weights speak no words, so
an utterance's length is sampled (--min-new-tokens to --max-new-tokens), not set by its text.

Usage: python bench/bench_captions.py [--words 60] [--interval-ms 150] [--runs 3]
       python bench/bench_captions.py --feed-rate 1.3 [--duration-s 180] [--max-lag-s 4]
       python bench/bench_captions.py --smoke   # both modes, a few seconds each; writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    CAPTION,
    REPO,
    Call,
    Playout,
    add_bench_server_arguments,
    arguments,
    bench_server,
    command,
    load_line,
    pct,
    push_words,
    table,
    write_result,
)

from chattts_client import AsyncTTSClient, AudioChunkEvent, Event, UtteranceEndEvent, make_config
from chattts_proto.chattts.v1 import tts_pb2


def caption_config(
    args: argparse.Namespace, max_lag_s: float = 0.0, min_new_tokens: int | None = None
) -> tts_pb2.SynthesisConfig:
    config = make_config(
        seed=1,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=min_new_tokens,
        max_lag_s=max_lag_s or None,
        hard_lag_s=args.hard_lag_s if max_lag_s else None,
    )
    policy = dict(first_words=args.first_words, max_words=args.max_words, idle_ms=args.idle_ms)
    config.text_release.CopyFrom(tts_pb2.TextReleasePolicy(**policy))
    if max_lag_s and args.catch_up_max_speed is not None:
        config.catch_up_max_speed = args.catch_up_max_speed
    return config


@dataclass
class Heard:
    """One utterance as the client saw it; times in s from the first word's send."""

    end: UtteranceEndEvent
    num_words: int
    sent_s: float  # send time of its first word
    heard_s: float | None  # playout time of its first sample; None without audio
    ended_s: float  # its UtteranceEnd's arrival

    @property
    def lag_s(self) -> float | None:
        return None if self.heard_s is None else self.heard_s - self.sent_s


@dataclass
class CaptionRun:
    label: str
    load: str
    call: Call = field(default_factory=Call)
    sent_at: list[float] = field(default_factory=list)  # each word's send (perf_counter)
    utterances: list[Heard] = field(default_factory=list)

    @property
    def words_sent(self) -> int:
        return len(self.sent_at)

    def spoken(self) -> list[Heard]:
        return [u for u in self.utterances if u.lag_s is not None]


async def caption_run(
    client: AsyncTTSClient,
    args: argparse.Namespace,
    label: str,
    num_words: int,
    interval_s: float,
    max_lag_s: float = 0.0,
) -> CaptionRun:
    """`num_words` caption words, one every `interval_s` (0: all at once), on a fresh stream,
    half-closed after the last."""
    run, playout = CaptionRun(label, load_line()), Playout()
    caption = list(itertools.islice(itertools.cycle(CAPTION), num_words))
    starts = [0]  # code-point offset of each word in the text sent
    for word in caption:
        starts.append(starts[-1] + len(word) + 1)
    first_heard: dict[int, float] = {}  # utterance_index -> playout of its first sample

    def on_event(event: Event, now: float) -> None:
        if isinstance(event, AudioChunkEvent):
            first_heard.setdefault(event.utterance_index, playout.play(now, event.duration_s))
        if not isinstance(event, UtteranceEndEvent):
            return
        t0, start, end = run.sent_at[0], event.source_start, event.source_end
        first = bisect.bisect_right(starts, start) - 1 if end else -1
        count = bisect.bisect_left(starts, end) - bisect.bisect_left(starts, start) if end else 0
        heard = first_heard.get(event.utterance_index) if event.num_samples else None
        sent = run.sent_at[first] if first >= 0 else now
        heard_s = None if heard is None else heard - t0
        run.utterances.append(Heard(event, count, sent - t0, heard_s, now - t0))

    config = caption_config(args, max_lag_s, args.min_new_tokens if args.feed_rate else None)
    run.call = await push_words(
        client,
        caption,
        config,
        interval_s,
        timeout_s=args.timeout_s,
        on_event=on_event,
        sent_at=run.sent_at,
    )
    run.load += " -> " + load_line().removeprefix("load average ")
    return run


async def pattern_runs(target: str, args: argparse.Namespace) -> list[CaptionRun]:
    async with AsyncTTSClient(target) as client:
        await caption_run(client, args, "warm-up", 6, args.interval_ms / 1000)
        return [
            await caption_run(client, args, f"run {i}", args.words, args.interval_ms / 1000)
            for i in range(args.runs)
        ]


def report_pattern(args: argparse.Namespace, runs: list[CaptionRun]) -> None:
    for r in runs:
        call, close_s = r.call, r.sent_at[-1] - r.sent_at[0]
        before = [d for a, d in zip(call.arrivals, call.durations, strict=True) if a < close_s]
        ttfa = "none" if call.ttfa_s is None else f"{call.ttfa_s:.3f} s"
        print(
            f"{r.label}: first audio {ttfa} after the first word; "
            f"{sum(u.ended_s < close_s for u in r.utterances)} of {len(r.utterances)} "
            f"utterances ended and {sum(before):.1f} s of audio arrived while the stream was "
            f"open; the stream ended {call.total_s - close_s:.2f} s after the half-close "
            f"({call.status})"
        )
    ttfas = [r.call.ttfa_s for r in runs if r.call.ttfa_s is not None] or [float("nan")]
    print(
        f"RESULT: time to first audio median {statistics.median(ttfas):.3f} s, "
        f"max {max(ttfas):.3f} s (target 1.5 s) [{load_line()}]"
    )


def voice_rate(run: CaptionRun) -> float:
    """Words per audio second of what `run` spoke."""
    spoken = run.spoken()
    return sum(u.num_words for u in spoken) / max(sum(u.end.audio_duration_s for u in spoken), 1e-9)


async def measure_feed(target: str, args: argparse.Namespace) -> list[CaptionRun]:
    """The calibration run, the run without max_lag_s, the run with it."""
    async with AsyncTTSClient(target) as client:
        # A first estimate on a prefix (it also warms the path), then the rate over about the
        # words the run will send: random weights make utterances' lengths vary by text.
        num_words = args.calibration_words
        for _ in range(2):
            calibration = await caption_run(client, args, "calibration", num_words, 0.0)
            voice = voice_rate(calibration)
            print(f"voice rate {voice:.2f} words/s over {num_words} words [{calibration.load}]")
            planned = int(args.duration_s * args.feed_rate * voice) + 1
            if planned <= num_words:
                break
            num_words = planned
        interval_s = 1 / (args.feed_rate * voice)
        count = int(args.duration_s / interval_s) + 1
        print(f"feeding {count} words, one every {1000 * interval_s:.0f} ms", flush=True)
        runs = [await caption_run(client, args, "no max_lag_s", count, interval_s)]
        label = f"max_lag_s {args.max_lag_s:g}"
        runs.append(await caption_run(client, args, label, count, interval_s, args.max_lag_s))
    return [calibration, *runs]


def base_speed(runs: list[CaptionRun]) -> int:
    """The speed level of the run without max_lag_s (its most common one)."""
    speeds = Counter(u.end.speed for u in runs[0].spoken())
    return speeds.most_common(1)[0][0] if speeds else 0


def figures(run: CaptionRun, base: int) -> list[object]:
    """The run's row of captions.md (FEED_HEADER): lags heard and the server's, shares of the
    words sent skipped and spoken above the `base` speed level."""
    lags = [u.lag_s for u in run.spoken() if u.lag_s is not None]
    server = [u.end.lag_s for u in run.utterances]
    off = [abs(u.end.lag_s - u.lag_s) for u in run.spoken() if u.lag_s is not None]
    skipped = sum(u.num_words for u in run.utterances if u.end.finish_reason == "skipped")
    sped_up = sum(u.num_words for u in run.spoken() if u.end.speed > base)
    shares = [f"{100 * n / max(run.words_sent, 1):.1f}%" for n in (skipped, sped_up)]
    heard = [lags[-1] if lags else float("nan"), max(lags, default=float("nan"))]
    heard += [pct(lags, 50), pct(lags, 95)]
    row: list[object] = [run.label, run.words_sent, len(run.utterances), *shares]
    row += [f"{v:.1f}" for v in heard]
    row.append(f"{pct(server, 50):.1f} / {pct(server, 95):.1f} / {max(server, default=0):.1f}")
    row.append(f"{max(off, default=float('nan')):.2f}")
    counts = sorted(Counter(u.end.finish_reason for u in run.utterances).items())
    return [*row, ", ".join(f"{k} {v}" for k, v in counts), run.load]


def speed_effect(runs: list[CaptionRun]) -> tuple[float, float, int, float]:
    """Whether a raised speed level made speech shorter: audio seconds per word at the base
    level and above it, the utterances above it, and two standard errors of the difference.
    Over the utterances of both runs that hold the usual number of words (max_words; the first
    and last are shorter and noisier)."""
    base = base_speed(runs)
    spoken = [u for run in runs for u in run.spoken() if u.num_words]
    usual = Counter(u.num_words for u in spoken).most_common(1)
    spoken = [u for u in spoken if usual and u.num_words == usual[0][0]]
    groups = [u for u in spoken if u.end.speed == base], [u for u in spoken if u.end.speed > base]
    per_word = [[u.end.audio_duration_s / u.num_words for u in group] for group in groups]
    variance = sum(statistics.variance(g) / len(g) for g in per_word if len(g) > 1)
    means = [statistics.fmean(g) if g else float("nan") for g in per_word]
    return means[0], means[1], len(groups[1]), 2 * variance**0.5


FEED_HEADER = (  # noqa: SIM905 - one string reads as the table header it is
    "run|words sent|utterances|words skipped|words sped up|heard lag at end (s)|max (s)|p50 (s)|"
    "p95 (s)|server lag_s p50 / p95 / max (s)|server off heard, max (s)|finish reasons|load"
).split("|")


def report_feed(args: argparse.Namespace, calibration: CaptionRun, runs: list[CaptionRun]) -> str:
    """Prints the result line and table; returns the markdown of captions.md."""
    base, voice = base_speed(runs), voice_rate(calibration)
    interval_s = 1 / (args.feed_rate * voice)
    rows = [figures(run, base) for run in runs]
    free, limited = (dict(zip(FEED_HEADER, row, strict=True)) for row in rows)
    base_s, faster_s, num_faster, noise_s = speed_effect(runs)
    met, hard_s = voice_rate(runs[0]), args.hard_lag_s or 2 * args.max_lag_s
    print(
        f"RESULT: feed {args.feed_rate:g}x the voice for {args.duration_s:g} s: heard lag at the "
        f"end {free['heard lag at end (s)']} s without max_lag_s, {limited['heard lag at end (s)']}"
        f" s with {args.max_lag_s:g} s (max {limited['max (s)']} s, p95 {limited['p95 (s)']} s; "
        f"words skipped {limited['words skipped']}, sped up {limited['words sped up']}) "
        f"[{load_line()}]\n{table(FEED_HEADER, rows)}"
    )
    noise = "beyond" if num_faster > 1 and abs(base_s - faster_s) > noise_s else "within"
    return f"""# Captions faster than the voice: lag with and without `max_lag_s`

Caption words without punctuation, one message per word, evenly spaced at {args.feed_rate:g}x
the voice's rate for {args.duration_s:g} s, on a fresh stream each run: without `max_lag_s`,
then with {args.max_lag_s:g} s (hard limit {hard_s:g} s). Lag: what a listener playing the
stream in real time from its first chunk hears, the playout of an utterance's first sample minus
the send of its first word. Server lag_s: `UtteranceEnd.lag_s`. Command: {command()}

Voice rate (calibration stream, the run's first {calibration.words_sent} words at once, same
policy and seed): {voice:.2f} words per audio second, one word every
{1000 * interval_s:.0f} ms; the run without a limit spoke {met:.2f} words per audio
second, so the feed was {1 / (interval_s * met):.2f}x the voice it met. Policy:
max_words {args.max_words}, first_words {args.first_words}, idle_ms {args.idle_ms};
{args.min_new_tokens}-{args.max_new_tokens} audio tokens per utterance; model
{args.model_dir or args.dev_model} on {args.device}.

{table(FEED_HEADER, rows)}

![lag over the run](captions_lag.png)

Audio per word above speed level {base}: {faster_s:.3f} s over {num_faster} utterances, against
{base_s:.3f} s at it; two standard errors of the difference {noise_s:.3f} s: {noise} sampling
noise (random weights ignore the speed level: catching up then comes from skipping). Shares are
of the words sent; "sped up": spoken above level {base}.
"""


def plot_feed(args: argparse.Namespace, voice: float, runs: list[CaptionRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    for run, colour in zip(runs, ("tab:red", "tab:blue"), strict=True):
        skipped = [u for u in run.utterances if u.end.finish_reason == "skipped"]
        for points, style, what in (
            ([(u.sent_s, u.lag_s) for u in run.spoken()], ".-", "heard lag"),
            ([(u.sent_s, u.end.lag_s) for u in run.utterances], ":", "server lag_s"),
            ([(u.sent_s, u.end.lag_s) for u in skipped], "x", f"skipped ({len(skipped)})"),
        ):
            if points:
                x, y = zip(*points, strict=True)
                ax.plot(x, y, style, color=colour, label=f"{run.label}: {what}")
    hard_s = args.hard_lag_s if args.hard_lag_s is not None else 2 * args.max_lag_s
    ax.axhline(args.max_lag_s, color="grey", linestyle="--", label=f"soft {args.max_lag_s:g} s")
    ax.axhline(hard_s, color="black", linestyle="--", label=f"hard {hard_s:g} s")
    title = f"Captions fed at {args.feed_rate:g}x the voice ({voice:.2f} words/s)"
    ax.set(xlabel="first word of the utterance sent at (s from the first)", ylabel="lag (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__, "12 words, then a 3 s feed at 1.3x; writes nothing")
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--interval-ms", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-words", type=int, default=4)
    parser.add_argument("--max-words", type=int, help="release policy's (20; 8 with --feed-rate)")
    parser.add_argument("--idle-ms", type=int, default=600)
    parser.add_argument("--max-new-tokens", type=int, default=200, help="per utterance")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--feed-rate", type=float, help="captions this many times the voice")
    parser.add_argument("--duration-s", type=float, default=180.0, help="--feed-rate: feed time")
    parser.add_argument("--max-lag-s", type=float, default=4.0, help="--feed-rate: 2nd run's")
    parser.add_argument("--hard-lag-s", type=float, help="--feed-rate: hard_lag_s (unset: 2x)")
    parser.add_argument("--catch-up-max-speed", type=int, help="--feed-rate: catch_up_max_speed")
    # Random weights sample EOS anywhere: a floor keeps the voice's rate steady.
    parser.add_argument("--min-new-tokens", type=int, default=100, help="--feed-rate: at least")
    parser.add_argument("--calibration-words", type=int, default=120, help="--feed-rate")
    parser.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    add_bench_server_arguments(parser)
    args = parser.parse_args()
    if not 0.5 <= args.max_lag_s <= 600:
        parser.error("--max-lag-s must be in [0.5, 600]")
    return args


def main() -> None:
    args = parse_args()
    feed = argparse.Namespace(**vars(args))
    feed.max_words = args.max_words or 8
    args.max_words = args.max_words or 20
    if args.smoke:
        args.words, args.runs, args.max_new_tokens = 12, 1, 30
        feed.feed_rate, feed.duration_s, feed.calibration_words = 1.3, 3.0, 16
        feed.max_words, feed.min_new_tokens, feed.max_new_tokens = 4, 20, 30
        feed.max_lag_s = 1.0
    runs: list[CaptionRun] = []
    with bench_server(args) as target:
        if args.feed_rate is None:
            runs = asyncio.run(pattern_runs(target, args))
            report_pattern(args, runs)
        result = asyncio.run(measure_feed(target, feed)) if feed.feed_rate else None
    if result is not None:
        markdown = report_feed(feed, result[0], result[1:])
        if not args.smoke:
            write_result(feed.out_dir / "captions.md", markdown)
            plot_feed(feed, voice_rate(result[0]), result[1:], feed.out_dir / "captions_lag.png")
    if args.feed_rate is None and not any(r.call.ttfa_s is not None for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
