"""Navigation prompts under a caption backlog: named segments that are replaced and expire.

A route replayed as timed prompts on one StreamingSynthesize stream at PRIORITY_INTERACTIVE,
one junction every `--junction-interval-s`:
  0.00 I   segment  jN  "In 800 metres, turn left onto Zhongguancun Street."   (late after 2 s)
  0.30 I   replace  jN  "In 400 metres, ..."  if_started CUT, expires_in_ms 3000
  0.55 I   replace  jN  "In 150 metres, ..."  if_started FINISH, expires_in_ms 3000
  0.80 I   replace  jN  "Turn left now."      if_started CUT, expires_in_ms 1500
and at every third junction a traffic note (segment infoN, late after 5 s) replaced 0.3 s later
with if_started DROP_NEW. Each prompt is one message (text, segment or replace, flush). Meanwhile
`--bulk` caption streams (PRIORITY_BULK, ASR words without punctuation every
`--word-interval-ms`, many times faster than the voice, as bench_priority.py feeds them) keep the
engine's batch full; the server runs with `--max-streams bulk + reserved --reserved-slots
reserved`, so the navigation stream takes a reserved place and contends for the engine's steps
(on the tiny model and 2 cores, fewer or slower caption streams leave the engine idle enough
that every prompt is generated whole before the next is sent, and nothing is replaced or cut).

Per prompt (a segment's revision) the client records its SegmentEnd outcome (SPOKEN, REPLACED,
CUT, EXPIRED, NOT_SPOKEN: what happened to that revision, e.g. cut by the next one) and its
first audio: the arrival of the first chunk of the first utterance whose
UtteranceEnd.source_start lies in the prompt's text (code points of all text sent), minus the
prompt's send time. A prompt is late when its first audio came after its deadline: its
expires_in_ms, or the deadline above for one without. On a playout clock (the stream played in
real time from its first chunk, no client-side flush) it also records when the listener hears
the prompt ("late as heard") and whether a replace was sent while the revision before it was
still to be heard ("old still heard": a CUT then cuts only audio the server has not sent yet;
"CUT heard in full" counts those CUTs whose old revision still ended SPOKEN).
Reports the counts and the first-audio p50/p95 per kind, with the load average (1, 5, 15 min)
beside every figure; writes bench/results/navigation.md (or --out). `--smoke` runs in seconds
and writes nothing.

The server is `chattts-server` (a subprocess, tiny random-weight dev model unless --dev-model
full or --model-dir), talked to with the generated stubs over loopback. Random weights: a
prompt's length is set by sampling (--prompt-min-new-tokens to --prompt-max-new-tokens audio
tokens), not by its words.

Usage: python bench/bench_navigation.py [--junctions 10] [--junction-interval-s 12] [--bulk 16]
       [--reserved 1] [--word-interval-ms 30] [--dev-model tiny|full | --model-dir DIR]
       [--server-arg=--interactive-hold-tokens=0 ...] [--out FILE]
       python bench/bench_navigation.py --smoke    # 2 junctions, 2 caption streams
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import sys
import time
from collections import Counter
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

import grpc  # noqa: E402
from _caption_feed import Playout, load_avg, reflow  # noqa: E402
from bench_priority import BulkStream, caption_stream  # noqa: E402

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402

STREETS = [
    ("left", "Zhongguancun Street"),
    ("right", "Chengfu Road"),
    ("left", "Xueyuan Road"),
    ("right", "Haidian Street"),
    ("left", "Suzhou Street"),
    ("right", "Wudaokou Road"),
]
OUTCOMES = {
    tts_pb2.SEGMENT_SPOKEN: "spoken",
    tts_pb2.SEGMENT_REPLACED: "replaced",
    tts_pb2.SEGMENT_CUT: "cut",
    tts_pb2.SEGMENT_EXPIRED: "expired",
    tts_pb2.SEGMENT_NOT_SPOKEN: "not spoken",
}
KINDS = ["announce", "update-cut", "update-finish", "now", "info", "info-drop-new"]


@dataclass
class Prompt:
    """One message of the route: a segment's revision, and what became of it."""

    at_s: float  # when it is sent, from the route's start
    name: str  # the segment
    text: str
    kind: str
    deadline_s: float  # first audio after this long from the send is late
    replace: bool = False  # a replace of `name`, else a new segment
    if_started: int = tts_pb2.IF_STARTED_UNSPECIFIED
    expires_in_ms: int = 0
    # Filled in by the run:
    sent_at: float | None = None  # time.monotonic() of the send
    span: tuple[int, int] = (0, 0)  # code points of the text sent on the stream
    first_audio_s: float | None = None  # from the send to its first chunk's arrival
    heard_s: tuple[float, float] | None = None  # playout of its audio, monotonic [start, end)
    old_audible: bool = False  # a replace sent while the revision before it was still heard
    cut_missed: bool = False  # ... with CUT, and that revision still ended SPOKEN (all sent)
    outcomes: list[str] = field(default_factory=list)  # its SegmentEnd outcome(s)
    revision: int | None = None  # SegmentEnd.revision

    @property
    def outcome(self) -> str:
        return (
            self.outcomes[0]
            if len(self.outcomes) == 1
            else "no SegmentEnd"
            if not self.outcomes
            else "several"
        )

    @property
    def late(self) -> bool:
        return self.first_audio_s is not None and self.first_audio_s > self.deadline_s

    @property
    def heard_after_s(self) -> float | None:
        """From the send to the listener hearing its first sample (after the audio before it)."""
        if self.heard_s is None or self.sent_at is None:
            return None
        return self.heard_s[0] - self.sent_at

    def message(self) -> tts_pb2.TextInput:
        message = tts_pb2.TextInput(
            text=self.text + " ", flush=True, expires_in_ms=self.expires_in_ms
        )
        if self.replace:
            message.replace = self.name
            message.if_started = self.if_started  # type: ignore[assignment]
        else:
            message.segment = self.name
        return message


def route(num_junctions: int, interval_s: float) -> list[Prompt]:
    """The prompts of `num_junctions` junctions, one every `interval_s`, in send order."""
    prompts = []
    for j in range(num_junctions):
        turn, street = STREETS[j % len(STREETS)]
        t, name = j * interval_s, f"j{j}"
        onto = f"turn {turn} onto {street}."
        prompts += [
            Prompt(t, name, f"In 800 metres, {onto}", "announce", 2.0),
            Prompt(
                t + 0.30 * interval_s,
                name,
                f"In 400 metres, {onto}",
                "update-cut",
                3.0,
                True,
                tts_pb2.CUT,
                3000,
            ),
            Prompt(
                t + 0.55 * interval_s,
                name,
                f"In 150 metres, {onto}",
                "update-finish",
                3.0,
                True,
                tts_pb2.FINISH,
                3000,
            ),
            Prompt(
                t + 0.80 * interval_s,
                name,
                f"Turn {turn} now.",
                "now",
                1.5,
                True,
                tts_pb2.CUT,
                1500,
            ),
        ]
        if j % 3 == 1:
            info, minutes = f"info{j}", 3 + j % 5
            prompts += [
                Prompt(
                    t + 0.42 * interval_s,
                    info,
                    f"Traffic is heavy ahead, expect a delay of {minutes} minutes.",
                    "info",
                    5.0,
                ),
                Prompt(
                    t + 0.42 * interval_s + 0.3,
                    info,
                    f"Traffic is heavy ahead, expect a delay of {minutes + 1} minutes.",
                    "info-drop-new",
                    5.0,
                    True,
                    tts_pb2.DROP_NEW,
                ),
            ]
    return sorted(prompts, key=lambda p: p.at_s)


@dataclass
class NavRun:
    prompts: list[Prompt]
    utterances: Counter[str] = field(default_factory=Counter)  # finish reasons
    unmatched_ends: int = 0  # SegmentEnds that matched no prompt sent
    misplaced: int = 0  # UtteranceEnds whose source span does not hold their source_text
    error: str = ""
    load_start: str = ""
    load_end: str = ""


async def navigate(stub: tts_pb2_grpc.TextToSpeechStub, args: argparse.Namespace) -> NavRun:
    """The route on one stream; the prompts' outcomes and first audio."""
    run = NavRun(route(args.junctions, args.junction_interval_s), load_start=load_avg())
    config = tts_pb2.SynthesisConfig(
        priority=tts_pb2.PRIORITY_INTERACTIVE,
        sampling=tts_pb2.Sampling(
            seed=7,
            max_new_tokens=args.prompt_max_new_tokens,
            min_new_tokens=args.prompt_min_new_tokens,
        ),
    )
    if args.pace_lead_s > 0:
        config.pace_lead_s = args.pace_lead_s
    starts: list[int] = []  # span start of each prompt sent, in send order (ascending)
    first_chunk: dict[int, float] = {}  # utterance_index -> arrival of its first chunk
    heard: dict[int, tuple[float, float]] = {}  # utterance_index -> playout [start, end)
    playout = Playout()
    by_text = {(p.name, p.text): p for p in run.prompts}
    sent_text: list[str] = []  # every TextInput.text sent, in order: source spans point into it

    async def requests():  # type: ignore[no-untyped-def]
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        t0, offset = time.monotonic(), 0
        for prompt in run.prompts:
            delay_s = t0 + prompt.at_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            message = prompt.message()
            prompt.sent_at = time.monotonic()
            prompt.span = (offset, offset + len(message.text))
            starts.append(offset)
            sent_text.append(message.text)
            offset += len(message.text)
            yield tts_pb2.StreamingSynthesizeRequest(text=message)

    try:
        async for reply in stub.StreamingSynthesize(requests(), timeout=args.timeout_s):
            now = time.monotonic()
            kind = reply.WhichOneof("response")
            if kind == "audio":
                index = reply.audio.utterance_index
                first_chunk.setdefault(index, now)
                seconds = reply.audio.num_samples / reply.audio.sample_rate_hz
                start = playout.play(now, seconds)
                heard[index] = (heard.get(index, (start, 0.0))[0], start + seconds)
            elif kind == "utterance_end":
                end = reply.utterance_end
                run.utterances[end.finish_reason] += 1
                if "".join(sent_text)[end.source_start : end.source_end] != end.source_text:
                    run.misplaced += 1
                i = bisect.bisect_right(starts, end.source_start) - 1
                arrived = first_chunk.get(end.utterance_index)
                if i < 0 or arrived is None or not end.num_samples or end.source_end == 0:
                    continue
                prompt = run.prompts[i]
                assert prompt.sent_at is not None
                if prompt.first_audio_s is None:
                    prompt.first_audio_s = arrived - prompt.sent_at
                start, stop = heard[end.utterance_index]
                old = prompt.heard_s
                prompt.heard_s = (start, stop) if old is None else (old[0], max(old[1], stop))
            elif kind == "segment_end":
                end = reply.segment_end
                found = by_text.get((end.name, end.text.strip()))
                if found is None:
                    run.unmatched_ends += 1
                else:
                    found.outcomes.append(OUTCOMES.get(end.outcome, str(end.outcome)))
                    found.revision = end.revision
    except grpc.aio.AioRpcError as exc:
        run.error = f"{exc.code().name}: {exc.details()}"
    run.load_end = load_avg()
    before: dict[str, Prompt] = {}
    for prompt in run.prompts:
        prior = before.get(prompt.name)
        if prompt.replace and prior and prior.heard_s and prompt.sent_at is not None:
            prompt.old_audible = prior.heard_s[1] > prompt.sent_at
            prompt.cut_missed = (
                prompt.old_audible
                and prompt.if_started == tts_pb2.CUT
                and prior.outcome == "spoken"
            )
        before[prompt.name] = prompt
    return run


async def measure(target: str, args: argparse.Namespace) -> tuple[NavRun, list[BulkStream]]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        stop = asyncio.Event()
        bulk = [BulkStream() for _ in range(args.bulk)]
        streams = [
            asyncio.create_task(caption_stream(stub, args, stop, b, i)) for i, b in enumerate(bulk)
        ]
        await asyncio.sleep(args.settle_s)  # every caption stream is speaking
        try:
            run = await navigate(stub, args)
        finally:
            # Cancelled, not half-closed: a half-closed caption stream would speak its backlog.
            stop.set()
            for stream in streams:
                stream.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
    return run, bulk


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def seconds(value: float) -> str:
    return "-" if np.isnan(value) else f"{value:.2f}"


def kind_rows(run: NavRun) -> list[list[str]]:
    """Per kind of prompt, then all: sent, the outcomes, late, first audio p50/p95/max."""
    rows = []
    for kind in [*KINDS, "all"]:
        prompts = [p for p in run.prompts if kind in ("all", p.kind)]
        if not prompts:
            continue
        outcomes = Counter(p.outcome for p in prompts)
        firsts = [p.first_audio_s for p in prompts if p.first_audio_s is not None]
        heard = [p.heard_after_s for p in prompts if p.heard_after_s is not None]
        late_heard = sum(
            p.heard_after_s is not None and p.heard_after_s > p.deadline_s for p in prompts
        )
        rows.append(
            [
                kind,
                str(len(prompts)),
                *(str(outcomes[o]) for o in [*OUTCOMES.values(), "no SegmentEnd"]),
                str(sum(p.late for p in prompts)),
                seconds(pct(firsts, 50)),
                seconds(pct(firsts, 95)),
                seconds(max(firsts, default=float("nan"))),
                str(late_heard),
                seconds(pct(heard, 95)),
                str(sum(p.old_audible for p in prompts)),
                str(sum(p.cut_missed for p in prompts)),
            ]
        )
    return rows


HEADER = [
    "prompt kind",
    "sent",
    "spoken",
    "replaced",
    "cut",
    "expired",
    "not spoken",
    "no SegmentEnd",
    "late",
    "first audio p50 (s)",
    "p95 (s)",
    "max (s)",
    "late as heard",
    "heard p95 (s)",
    "old still heard",
    "CUT heard in full",
]


def anomalies(run: NavRun) -> list[str]:
    """What breaks the contract as the client sees it (printed, not asserted)."""
    notes = []
    several = [p for p in run.prompts if len(p.outcomes) > 1]
    if several:
        notes.append(f"{len(several)} prompts got more than one SegmentEnd")
    heard_but_silent = [
        p
        for p in run.prompts
        if p.first_audio_s is not None and p.outcome in ("replaced", "expired", "not spoken")
    ]
    if heard_but_silent:
        notes.append(
            f"{len(heard_but_silent)} prompts had audio yet ended replaced/expired/not spoken"
        )
    if run.misplaced:
        notes.append(
            f"{run.misplaced} UtteranceEnds' source_start/source_end did not hold their "
            "source_text in the text sent (their prompts' first audio may be misattributed)"
        )
    if run.unmatched_ends:
        notes.append(f"{run.unmatched_ends} SegmentEnds matched no prompt sent")
    if run.error:
        notes.append(f"the navigation stream failed: {run.error}")
    return notes


def timeline(run: NavRun) -> list[str]:
    """Each prompt: when it was sent, its first audio, when it was heard, its outcome."""
    sent = [p.sent_at for p in run.prompts if p.sent_at is not None]
    t0 = min(sent, default=0.0)
    lines = []
    for p in run.prompts:
        first = "-" if p.first_audio_s is None else f"+{p.first_audio_s:.2f} s"
        heard = "-" if p.heard_after_s is None else f"+{p.heard_after_s:.2f} s"
        at = float("nan") if p.sent_at is None else p.sent_at - t0
        lines.append(
            f"{at:7.2f} s {p.name:>6} rev {p.revision} {p.kind:<13} first audio {first:>9} "
            f"heard {heard:>9} {p.outcome:<10} {'LATE ' if p.late else ''}{p.text}"
        )
    return lines


def report(args: argparse.Namespace, run: NavRun, bulk: list[BulkStream]) -> str:
    """Prints the figures; returns them as markdown."""
    if args.timeline:
        print("\n".join(timeline(run)))
    rows = kind_rows(run)
    bulk_errors = [b.error for b in bulk if b.error]
    bulk_audio = sum(a for b in bulk for _, a in b.chunks)
    setup = (
        f"{args.junctions} junctions, one every {args.junction_interval_s:g} s "
        f"({len(run.prompts)} prompts, PRIORITY_INTERACTIVE, "
        f"{args.prompt_min_new_tokens}-{args.prompt_max_new_tokens} audio tokens each) on one "
        f"stream, beside {args.bulk} caption streams (PRIORITY_BULK, a word every "
        f"{args.word_interval_ms} ms, up to {args.bulk_max_new_tokens} tokens an utterance) on "
        f"--max-streams {args.bulk + args.reserved} --reserved-slots {args.reserved}; "
        + (
            f"the route's stream paced {args.pace_lead_s:g} s ahead of real time (pace_lead_s)"
            if args.pace_lead_s > 0
            else "the route's stream unpaced (audio sent as fast as it is made)"
        )
    )
    print(setup)
    width = [max(len(c) for c in column) for column in zip(HEADER, *rows, strict=True)]
    for row in [HEADER, *rows]:
        print(
            row[0].ljust(width[0]), *(c.rjust(w) for c, w in zip(row[1:], width[1:], strict=True))
        )
    print(
        f"navigation utterances by finish reason: {dict(run.utterances)}; caption streams got "
        f"{bulk_audio:.0f} s of audio [{run.load_start} -> {run.load_end}]"
    )
    notes = anomalies(run) + ([f"caption stream errors: {bulk_errors[:3]}"] if bulk_errors else [])
    for note in notes:
        print(f"NOTE: {note}")
    total = dict(zip(HEADER, rows[-1], strict=True))
    print(
        f"RESULT: {total['sent']} prompts: {total['late']} late, {total['replaced']} replaced, "
        f"{total['cut']} cut, {total['expired']} expired, {total['not spoken']} not spoken, "
        f"{total['no SegmentEnd']} without SegmentEnd; first audio p50 "
        f"{total['first audio p50 (s)']} s, p95 {total['p95 (s)']} s [{load_avg()}]"
    )
    table = "\n".join(
        ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        + ["| " + " | ".join(row) + " |" for row in rows]
    )
    return reflow(f"""# Navigation prompts under a caption backlog

`bench/bench_navigation.py`: {setup}. Each junction: "In 800 metres, turn ..." (a new segment,
late after 2 s), "In 400 metres" (replace, if_started CUT, expires_in_ms 3000), "In 150 metres"
(replace, FINISH, 3000), "Turn ... now." (replace, CUT, 1500) at 0, 0.30, 0.55 and 0.80 of the
interval; every third junction a traffic note (late after 5 s) replaced 0.3 s later with
DROP_NEW. Each row counts revisions by kind; the outcome columns are each revision's own
SegmentEnd (an "update-finish" revision is cut by the "now" that follows it with CUT). First
audio: from the prompt's send to the arrival of its first chunk; late: after its
expires_in_ms, or the deadline above. "Late as heard" and "heard p95": when a listener who
plays the stream in real time from its first chunk (and drops nothing) hears its first
sample. "Old still heard": replaces sent while the revision before them was still to be heard;
the server decides `if_started` on audio sent, so a CUT of a revision whose audio has all been
sent cuts nothing the listener has not got: "CUT heard in full" counts CUT replaces sent while
the revision before them was still to be heard that ended SPOKEN nonetheless.

Command: `python {" ".join(sys.argv)}`

{args.dev_model if not args.model_dir else args.model_dir} model on {args.device},
{os.cpu_count()} CPUs; load average (1, 5, 15 min) {run.load_start.removeprefix("load ")} at
the route's start, {run.load_end.removeprefix("load ")} at its end.

{table}

Navigation utterances by finish reason: {dict(run.utterances)}. The caption streams got
{bulk_audio:.0f} s of audio in all. {" ".join(n + "." for n in notes) or "No contract anomaly seen by the client (one SegmentEnd per prompt, no audio for a replaced, expired or not-spoken one)."}

<details><summary>Every prompt: sent at (s from the first), first audio and first heard (from its
send), outcome</summary>

```
{chr(10).join(timeline(run))}
```
</details>
""")


def main() -> None:
    from chattts_devtools.launcher import add_bench_server_arguments, bench_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junctions", type=int, default=10)
    parser.add_argument(
        "--junction-interval-s",
        type=float,
        default=12.0,
        help="a junction's four prompts, up to ~2 s of audio each, fit in it",
    )
    parser.add_argument("--bulk", type=int, default=16, help="caption streams (PRIORITY_BULK)")
    parser.add_argument("--reserved", type=int, default=1, help="--reserved-slots")
    parser.add_argument(
        "--word-interval-ms", type=int, default=30, help="caption streams' pace (30: ~10x voice)"
    )
    parser.add_argument(
        "--pace-lead-s",
        type=float,
        default=0.5,
        help="the route stream's SynthesisConfig.pace_lead_s (0: unpaced)",
    )
    parser.add_argument("--bulk-max-new-tokens", type=int, default=200)
    parser.add_argument("--prompt-max-new-tokens", type=int, default=100)
    parser.add_argument("--prompt-min-new-tokens", type=int, default=40)
    parser.add_argument("--settle-s", type=float, default=5.0, help="bulk start-up, unmeasured")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    add_bench_server_arguments(parser)
    parser.add_argument("--timeline", action="store_true", help="print every prompt's fate")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "navigation.md")
    parser.add_argument(
        "--smoke", action="store_true", help="2 junctions 3 s apart, 2 caption streams; no file"
    )
    args = parser.parse_args()
    if args.smoke:
        args.junctions, args.junction_interval_s, args.bulk = 2, 3.0, 2
        args.settle_s, args.bulk_max_new_tokens = 1.0, 40
        args.prompt_max_new_tokens, args.prompt_min_new_tokens = 30, 10

    server_args = [
        *("--max-streams", str(args.bulk + args.reserved)),
        *("--reserved-slots", str(args.reserved)),
        *("--max-queue", str(args.bulk + 1)),
    ]
    with bench_server(args, server_args) as target:
        run, bulk = asyncio.run(measure(target, args))
    markdown = report(args, run, bulk)
    if not args.smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown)
        print(f"wrote {args.out}")
    if run.error or not any(p.first_audio_s is not None for p in run.prompts):
        sys.exit(1)


if __name__ == "__main__":
    main()
