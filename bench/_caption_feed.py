"""The `--feed-rate` mode of bench/bench_captions.py: captions fed faster than the voice speaks
them, the lag a real-time listener hears with and without `max_lag_s`, its table and plot.

A helper module (not a script): bench_captions.py puts client/ and server/ on sys.path first.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import statistics
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

CAPTION_TEXT = (
    "so what we are seeing here is that the traffic on the ring road is building up again "
    "and if you are heading into the city this evening you should expect delays of around "
    "twenty minutes near the bridge where the right lane is still closed for repairs so "
    "consider taking the northern route instead"
)
CAPTION = CAPTION_TEXT.split()


def words(count: int) -> list[str]:
    return [CAPTION[i % len(CAPTION)] for i in range(count)]


def load_avg() -> str:
    """The load average (1, 5, 15 min), printed beside every figure: the machine is shared."""
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def reflow(markdown: str) -> str:
    """Paragraphs filled to 100 columns (headings, tables, images, HTML and code kept)."""
    blocks = []
    for block in markdown.strip().split("\n\n"):
        if block.startswith(("#", "|", "!", "<", "```")):
            blocks.append(block)
        else:
            blocks.append(textwrap.fill(" ".join(block.split()), width=100))
    return "\n\n".join(blocks) + "\n"


class Playout:
    """When a listener who plays the stream in real time from its first chunk hears each chunk:
    the first chunk starts playback, each later one plays once the one before it has ended (or
    when it arrives, if the player ran dry)."""

    def __init__(self) -> None:
        self.end_s: float | None = None

    def play(self, arrival_s: float, seconds: float) -> float:
        """The playout time of this chunk's first sample."""
        start_s = arrival_s if self.end_s is None else max(arrival_s, self.end_s)
        self.end_s = start_s + seconds
        return start_s


@dataclass
class Heard:
    """One utterance of a feed run, as the client saw it; times from the first word's send."""

    first_word: int  # index of its first word in the words sent; -1 for no caller text
    num_words: int
    sent_s: float  # send time of its first word
    heard_s: float | None  # playout time of its first sample; None without audio
    audio_s: float
    server_lag_s: float
    speed: int
    finish_reason: str

    @property
    def lag_s(self) -> float | None:
        """The lag the listener hears: its first sample played minus its first word sent."""
        return None if self.heard_s is None else self.heard_s - self.sent_s


@dataclass
class FeedRun:
    label: str
    max_lag_s: float  # 0: no limit
    words_sent: int = 0
    utterances: list[Heard] = field(default_factory=list)
    load_start: str = ""
    load_end: str = ""
    wall_s: float = 0.0

    def spoken(self) -> list[Heard]:
        return [u for u in self.utterances if u.lag_s is not None]

    def lags(self) -> list[float]:
        return [u.lag_s for u in self.spoken() if u.lag_s is not None]

    def words_where(self, keep: Callable[[Heard], bool]) -> int:
        return sum(u.num_words for u in self.utterances if keep(u))


def feed_config(args: argparse.Namespace, max_lag_s: float) -> tts_pb2.SynthesisConfig:
    config = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(
            seed=1, max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens
        ),
        text_release=tts_pb2.TextReleasePolicy(
            first_words=args.first_words, max_words=args.max_words, idle_ms=args.idle_ms
        ),
    )
    if max_lag_s:
        config.max_lag_s = max_lag_s
        if args.hard_lag_s is not None:
            config.hard_lag_s = args.hard_lag_s
        if args.catch_up_max_speed is not None:
            config.catch_up_max_speed = args.catch_up_max_speed
    return config


async def feed_run(
    stub: tts_pb2_grpc.TextToSpeechStub,
    args: argparse.Namespace,
    label: str,
    num_words: int,
    interval_s: float,
    max_lag_s: float,
) -> FeedRun:
    """`num_words` caption words, one every `interval_s` (0: all at once), on a fresh stream."""
    run = FeedRun(label, max_lag_s, load_start=load_avg())
    sent = words(num_words)  # the caption cycled: the calibration stream reads a prefix
    starts: list[int] = []  # code-point offset of each word in the text sent
    send_s: list[float] = []  # monotonic send time of each word
    offset = 0
    for word in sent:
        starts.append(offset)
        offset += len(word) + 1
    playout = Playout()
    first_heard: dict[int, float] = {}  # utterance_index -> playout time of its first sample
    t0 = time.monotonic()

    async def requests():  # type: ignore[no-untyped-def]
        yield tts_pb2.StreamingSynthesizeRequest(config=feed_config(args, max_lag_s))
        for i, word in enumerate(sent):
            # An absolute schedule, so the pace does not drift with the event loop's delays.
            delay_s = t0 + i * interval_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            send_s.append(time.monotonic())
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=word + " "))

    async for reply in stub.StreamingSynthesize(requests(), timeout=args.timeout_s):
        now = time.monotonic()
        if reply.HasField("audio"):
            seconds = reply.audio.num_samples / reply.audio.sample_rate_hz
            heard = playout.play(now, seconds)
            first_heard.setdefault(reply.audio.utterance_index, heard)
        elif reply.HasField("utterance_end"):
            end = reply.utterance_end
            first = bisect.bisect_right(starts, end.source_start) - 1
            count = bisect.bisect_left(starts, end.source_end) - bisect.bisect_left(
                starts, end.source_start
            )
            if end.source_end == 0 or first < 0:
                first, count = -1, 0
            sent_at = send_s[first] if first >= 0 else now
            heard_at = first_heard.get(end.utterance_index) if end.num_samples else None
            run.utterances.append(
                Heard(
                    first_word=first,
                    num_words=count,
                    sent_s=sent_at - send_s[0],
                    heard_s=None if heard_at is None else heard_at - send_s[0],
                    audio_s=end.audio_duration_s,
                    server_lag_s=end.lag_s,
                    speed=end.speed,
                    finish_reason=end.finish_reason,
                )
            )
    run.words_sent = len(send_s)
    run.wall_s = time.monotonic() - t0
    run.load_end = load_avg()
    return run


@dataclass
class FeedResult:
    voice_words_per_s: float  # measured on the calibration stream
    calibration: FeedRun
    interval_s: float
    runs: list[FeedRun]


async def calibrate(
    stub: tts_pb2_grpc.TextToSpeechStub, args: argparse.Namespace, num_words: int
) -> tuple[float, FeedRun]:
    """The voice's rate in words per audio second, from the run's first `num_words` words sent
    at once and released as the run releases them (the same policy and seed give the same
    utterances, so the no-limit run speaks what this measured)."""
    calibration = await feed_run(stub, args, "calibration", num_words, 0.0, 0.0)
    spoken = calibration.spoken()
    audio_s = sum(u.audio_s for u in spoken)
    if not audio_s:
        raise RuntimeError("the calibration stream got no audio")
    voice = sum(u.num_words for u in spoken) / audio_s
    print(
        f"voice rate {voice:.2f} words per audio second ({sum(u.num_words for u in spoken)} "
        f"words, {audio_s:.1f} s of audio, {len(spoken)} utterances) [{calibration.load_end}]",
        flush=True,
    )
    return voice, calibration


async def measure_feed(target: str, args: argparse.Namespace) -> FeedResult:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        # A first estimate on a prefix (it also warms the path), then the rate of about the
        # words the run will send: random weights make utterances' lengths vary by text.
        voice, calibration = await calibrate(stub, args, args.calibration_words)
        planned = int(args.duration_s * args.feed_rate * voice) + 1
        if planned > args.calibration_words:
            voice, calibration = await calibrate(stub, args, planned)
        interval_s = 1 / (args.feed_rate * voice)
        num_words = int(args.duration_s / interval_s) + 1
        print(
            f"feeding {num_words} words, one every {1000 * interval_s:.0f} ms "
            f"({args.feed_rate:g}x {voice:.2f} words/s)",
            flush=True,
        )
        runs: list[FeedRun] = []
        for label, max_lag_s in (
            ("no max_lag_s", 0.0),
            (f"max_lag_s {args.max_lag_s:g}", args.max_lag_s),
        ):
            run = await feed_run(stub, args, label, num_words, interval_s, max_lag_s)
            print(summary_line(run, base_speed(runs or [run])), flush=True)
            runs.append(run)
    return FeedResult(voice, calibration, interval_s, runs)


def base_speed(runs: list[FeedRun]) -> int:
    """The speed level of the run without max_lag_s (its most common one)."""
    speeds = Counter(u.speed for u in runs[0].utterances if u.lag_s is not None)
    return speeds.most_common(1)[0][0] if speeds else 0


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class RunFigures:
    skipped_share: float  # of the words sent
    sped_up_share: float
    end_lag_s: float  # of the last utterance spoken
    max_lag_s: float
    p50_s: float
    p95_s: float
    server_p50_s: float
    server_p95_s: float
    server_max_s: float
    server_off_s: float  # largest |server lag_s - heard lag| over the utterances spoken
    reasons: Counter[str]


def figures(run: FeedRun, base: int) -> RunFigures:
    lags = run.lags()
    spoken = run.spoken()
    server = [u.server_lag_s for u in run.utterances]
    words = max(run.words_sent, 1)
    return RunFigures(
        skipped_share=run.words_where(lambda u: u.finish_reason == "skipped") / words,
        sped_up_share=run.words_where(lambda u: u.lag_s is not None and u.speed > base) / words,
        end_lag_s=spoken[-1].lag_s if spoken and spoken[-1].lag_s is not None else float("nan"),
        max_lag_s=max(lags, default=float("nan")),
        p50_s=pct(lags, 50),
        p95_s=pct(lags, 95),
        server_p50_s=pct(server, 50),
        server_p95_s=pct(server, 95),
        server_max_s=max(server, default=float("nan")),
        server_off_s=max(
            (abs(u.server_lag_s - u.lag_s) for u in spoken if u.lag_s is not None),
            default=float("nan"),
        ),
        reasons=Counter(u.finish_reason for u in run.utterances),
    )


def summary_line(run: FeedRun, base: int) -> str:
    f = figures(run, base)
    return (
        f"{run.label}: {run.words_sent} words, {len(run.utterances)} utterances "
        f"({dict(f.reasons)}); skipped {100 * f.skipped_share:.0f}% of the words, sped up "
        f"{100 * f.sped_up_share:.0f}%; heard lag at the end {f.end_lag_s:.1f} s, max "
        f"{f.max_lag_s:.1f} s, p50 {f.p50_s:.1f} s, p95 {f.p95_s:.1f} s; server lag_s p50 "
        f"{f.server_p50_s:.1f} s, p95 {f.server_p95_s:.1f} s, max {f.server_max_s:.1f} s, "
        f"at most {f.server_off_s:.2f} s off the heard lag [{run.load_start} -> {run.load_end}]"
    )


def hard_limit_s(args: argparse.Namespace) -> float:
    return args.hard_lag_s if args.hard_lag_s is not None else 2 * args.max_lag_s


def seconds_per_word(utterances: list[Heard]) -> float:
    words = sum(u.num_words for u in utterances)
    return sum(u.audio_s for u in utterances) / words if words else float("nan")


@dataclass
class SpeedEffect:
    """Whether a raised speed level made speech shorter: audio seconds per word at the base
    level and above it, and the noise of that difference. Over the utterances of both runs that
    hold the usual number of words (max_words; the first and last are shorter and noisier)."""

    base_s: float
    faster_s: float
    num_faster: int
    noise_s: float  # two standard errors of the difference (per-utterance spread)

    @property
    def significant(self) -> bool:
        return self.num_faster > 1 and abs(self.base_s - self.faster_s) > self.noise_s


def speed_effect(result: FeedResult) -> SpeedEffect:
    base = base_speed(result.runs)
    spoken = [u for run in result.runs for u in run.spoken() if u.num_words]
    usual = Counter(u.num_words for u in spoken).most_common(1)
    spoken = [u for u in spoken if usual and u.num_words == usual[0][0]]
    groups = [u for u in spoken if u.speed == base], [u for u in spoken if u.speed > base]
    variance = 0.0
    for group in groups:
        per_word = [u.audio_s / u.num_words for u in group]
        if len(per_word) > 1:
            variance += statistics.variance(per_word) / len(per_word)
    return SpeedEffect(
        seconds_per_word(groups[0]),
        seconds_per_word(groups[1]),
        len(groups[1]),
        2 * variance**0.5,
    )


def realized_rate(result: FeedResult) -> float:
    """Words per audio second of the run without max_lag_s: the voice the feed really met."""
    spoken = result.runs[0].spoken()
    return sum(u.num_words for u in spoken) / max(sum(u.audio_s for u in spoken), 1e-9)


def report_feed(args: argparse.Namespace, result: FeedResult) -> None:
    base = base_speed(result.runs)
    free, limited = (figures(run, base) for run in result.runs)
    speed = speed_effect(result)
    realized = realized_rate(result)
    print(
        f"realized voice rate without max_lag_s {realized:.2f} words/s: feed / voice = "
        f"{1 / (result.interval_s * realized):.2f}; audio per word {speed.base_s:.3f} s at speed "
        f"{base}, {speed.faster_s:.3f} s over {speed.num_faster} faster utterances (noise "
        f"+/-{speed.noise_s:.3f} s)"
    )
    print(
        f"RESULT: feed {args.feed_rate:g}x the voice for {args.duration_s:g} s: heard lag at the "
        f"end {free.end_lag_s:.1f} s without max_lag_s, {limited.end_lag_s:.1f} s with "
        f"{args.max_lag_s:g} s (max {limited.max_lag_s:.1f} s, p95 {limited.p95_s:.1f} s; "
        f"words skipped {100 * limited.skipped_share:.0f}%, sped up "
        f"{100 * limited.sped_up_share:.0f}%) [{load_avg()}]"
    )


def plot_feed(args: argparse.Namespace, result: FeedResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    for run, colour in zip(result.runs, ("tab:red", "tab:blue"), strict=True):
        points = [(u.sent_s, u.lag_s) for u in run.spoken() if u.lag_s is not None]
        ax.plot(
            [sent for sent, _ in points],
            [lag for _, lag in points],
            "-",
            color=colour,
            marker=".",
            markersize=3,
            label=f"{run.label}: heard lag",
        )
        ax.plot(
            [u.sent_s for u in run.utterances],
            [u.server_lag_s for u in run.utterances],
            ":",
            color=colour,
            alpha=0.6,
            label=f"{run.label}: server lag_s",
        )
        skipped = [u for u in run.utterances if u.finish_reason == "skipped"]
        if skipped:
            ax.plot(
                [u.sent_s for u in skipped],
                [u.server_lag_s for u in skipped],
                "x",
                color=colour,
                label=f"{run.label}: skipped ({len(skipped)}), at server lag_s",
            )
    ax.axhline(args.max_lag_s, color="grey", linestyle="--", label=f"soft {args.max_lag_s:g} s")
    ax.axhline(
        hard_limit_s(args), color="black", linestyle="--", label=f"hard {hard_limit_s(args):g} s"
    )
    ax.set_xlabel("first word of the utterance sent at (s from the first word)")
    ax.set_ylabel("lag (s)")
    ax.set_title(
        f"Captions fed at {args.feed_rate:g}x the voice ({result.voice_words_per_s:.2f} words/s), "
        f"{args.dev_model if not args.model_dir else 'real'} model"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_feed_md(args: argparse.Namespace, result: FeedResult, path: Path, png: Path) -> None:
    base = base_speed(result.runs)
    rows = []
    for run in result.runs:
        f = figures(run, base)
        rows.append(
            f"| {run.label} | {run.words_sent} | {len(run.utterances)} | "
            f"{100 * f.skipped_share:.1f}% | {100 * f.sped_up_share:.1f}% | {f.end_lag_s:.1f} | "
            f"{f.max_lag_s:.1f} | {f.p50_s:.1f} | {f.p95_s:.1f} | {f.server_p50_s:.1f} / "
            f"{f.server_p95_s:.1f} / {f.server_max_s:.1f} | {f.server_off_s:.2f} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(f.reasons.items()))} | "
            f"{run.load_start.removeprefix('load ')} -> {run.load_end.removeprefix('load ')} |"
        )
    speed = speed_effect(result)
    compared = (
        f"{speed.faster_s:.3f} s of audio per word against {speed.base_s:.3f} s at level {base}; "
        f"two standard errors of the difference, from the spread of utterance lengths, "
        f"{speed.noise_s:.3f} s"
    )
    if speed.num_faster and not speed.significant:
        speed_note = (
            f"The {speed.num_faster} utterances spoken at a raised speed level were not shorter "
            f"per word beyond sampling noise ({compared}): the random weights ignore the speed "
            "level, so on this model catching up comes from skipping (with real weights the "
            "level is ChatTTS's own speed control; not measured here)."
        )
    elif speed.num_faster:
        speed_note = (
            f"The {speed.num_faster} utterances at a raised speed level differed in length per "
            f"word beyond sampling noise ({compared})."
        )
    else:
        speed_note = f"No utterance was spoken above speed level {base}."
    calib = result.calibration
    text = f"""# Captions faster than the voice: lag with and without `max_lag_s`

`bench/bench_captions.py --feed-rate`: caption words without punctuation, one message per word,
evenly spaced at {args.feed_rate:g}x the voice's rate on this server, for {args.duration_s:g} s,
on a fresh StreamingSynthesize stream each run: once without `SynthesisConfig.max_lag_s`, once
with `max_lag_s` {args.max_lag_s:g} s (hard limit {hard_limit_s(args):g} s). Lag is what a
listener who plays the stream in real time from its first chunk hears: the playout time of an
utterance's first sample minus the send time of its first word (from
`UtteranceEnd.source_start`). Server lag_s is `UtteranceEnd.lag_s`.

Command: `python {" ".join(sys.argv)}`

Voice rate (calibration stream, the run's first {calib.words_sent} words at once, same policy
and seed): {result.voice_words_per_s:.2f} words per audio second, so one word every
{1000 * result.interval_s:.0f} ms; the run without a limit spoke
{realized_rate(result):.2f} words per audio second, so the feed was
{1 / (result.interval_s * realized_rate(result)):.2f}x the voice it met. Policy: max_words {args.max_words}, first_words
{args.first_words}, idle_ms {args.idle_ms}; {args.min_new_tokens}-{args.max_new_tokens} audio
tokens per utterance; {args.dev_model if not args.model_dir else args.model_dir} model on
{args.device}, {os.cpu_count()} CPUs. Load average (1, 5, 15 min) at each run's start and end
in the table; at the end {load_avg().removeprefix("load ")}.

| run | words sent | utterances | words skipped | words sped up | heard lag at end (s) | max (s) | p50 (s) | p95 (s) | server lag_s p50 / p95 / max (s) | server off heard, max (s) | finish reasons | load avg |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

![lag over the run]({png.name})

{speed_note} Skipped and sped-up shares are of the words sent; "sped up" is an utterance
spoken above the level of the run without a limit (level {base}). Lag percentiles are over the
utterances spoken, one value each.
"""
    path.write_text(reflow(text))
