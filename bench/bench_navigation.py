"""Navigation prompts under a caption backlog: named segments that are replaced and expire.

A route replayed on one PushStream at PRIORITY_INTERACTIVE (JUNCTION: a new segment, then three
replaces of it; every third junction a traffic note replaced with DROP_NEW) beside `--bulk`
caption streams at PRIORITY_BULK, a word every `--word-interval-ms` (many times the voice), that
keep the batch full on `--max-streams bulk + reserved --reserved-slots reserved` (fewer leave
the tiny model idle enough that every prompt is spoken whole, and nothing is replaced or cut).

Per prompt (a segment's revision): its SegmentEnd outcome and first audio (the first chunk of
the first utterance whose UtteranceEnd.source_start lies in its text, from its send); late:
after its expires_in_ms, or its kind's deadline. On a playout clock (the stream played in real
time from its first chunk): when the listener hears it ("late as heard", "heard p95"), whether
a replace came while the revision before it was still to be heard ("old still heard"), and
such CUTs whose old revision still ended SPOKEN ("CUT heard in full": `if_started` is decided
on audio sent). Writes bench/results/navigation.md (or --out). Random weights: a prompt's
length is sampled (--prompt-min-new-tokens to --prompt-max-new-tokens audio tokens).

Usage: python bench/bench_navigation.py [--junctions 10] [--bulk 16] [--pace-lead-s 0.5] ...
       python bench/bench_navigation.py --smoke    # 2 junctions, 2 caption streams
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    REPO,
    Call,
    Playout,
    add_bench_server_arguments,
    arguments,
    bench_server,
    caption_backlog,
    command,
    load_line,
    pct,
    record,
    table,
    write_result,
)

from chattts_client import (
    AsyncTTSClient,
    AudioChunkEvent,
    Event,
    PushStream,
    SegmentEndEvent,
    UtteranceEndEvent,
    make_config,
)
from chattts_proto.chattts.v1 import tts_pb2

STREETS = [("left", "Zhongguancun Street"), ("right", "Chengfu Road"), ("left", "Xueyuan Road"),
           ("right", "Haidian Street"), ("left", "Suzhou Street"), ("right", "Wudaokou Road")]  # fmt: skip
JUNCTION = [  # share of the interval, text, kind, deadline s, if_started, expires_in_ms
    (0.00, "In 800 metres, turn {turn} onto {street}.", "announce", 2.0, "", 0),
    (0.30, "In 400 metres, turn {turn} onto {street}.", "update-cut", 3.0, "cut", 3000),
    (0.55, "In 150 metres, turn {turn} onto {street}.", "update-finish", 3.0, "finish", 3000),
    (0.80, "Turn {turn} now.", "now", 1.5, "cut", 1500),
]
NOTE = "Traffic is heavy ahead, expect a delay of {} minutes."  # at 0.42, late after 5 s
KINDS = [kind for _, _, kind, *_ in JUNCTION] + ["info", "info-drop-new"]
OUTCOMES = ["spoken", "replaced", "cut", "expired", "not spoken", "no SegmentEnd"]


@dataclass
class Prompt:
    """One message of the route: a segment's revision, and what became of it."""

    at_s: float  # when it is sent, from the route's start
    name: str  # the segment
    text: str
    kind: str
    deadline_s: float  # first audio after this long from the send is late
    if_started: str = ""  # a replace's ("cut", "finish", "drop_new"); "": a new segment
    expires_in_ms: int = 0
    sent_at: float | None = None  # perf_counter of the send
    first_audio_s: float | None = None  # from the send to its first chunk's arrival
    heard_s: tuple[float, float] | None = None  # its audio's playout (perf_counter) [start, end)
    old_audible: bool = False  # a replace sent while the revision before it was still heard
    cut_missed: bool = False  # ... with CUT, and that revision still ended SPOKEN (all sent)
    outcomes: list[str] = field(default_factory=list)  # its SegmentEnd outcome(s)
    revision: int | None = None

    @property
    def outcome(self) -> str:
        return {0: "no SegmentEnd", 1: "".join(self.outcomes)}.get(len(self.outcomes), "several")

    @property
    def late(self) -> bool:
        return self.first_audio_s is not None and self.first_audio_s > self.deadline_s

    @property
    def heard_after_s(self) -> float | None:
        if self.heard_s is None or self.sent_at is None:
            return None
        return self.heard_s[0] - self.sent_at


def route(num_junctions: int, interval_s: float) -> list[Prompt]:
    prompts = []
    for j in range(num_junctions):
        turn, street = STREETS[j % len(STREETS)]
        for share, text, kind, deadline_s, if_started, expires_ms in JUNCTION:
            text = text.format(turn=turn, street=street)
            at_s = (j + share) * interval_s
            prompts.append(Prompt(at_s, f"j{j}", text, kind, deadline_s, if_started, expires_ms))
        if j % 3 == 1:
            at_s, name, minutes = (j + 0.42) * interval_s, f"info{j}", 3 + j % 5
            prompts.append(Prompt(at_s, name, NOTE.format(minutes), "info", 5.0))
            note = NOTE.format(minutes + 1)
            prompts.append(Prompt(at_s + 0.3, name, note, "info-drop-new", 5.0, "drop_new"))
    return sorted(prompts, key=lambda p: p.at_s)


@dataclass
class NavRun:
    prompts: list[Prompt]
    starts: list[int] = field(default_factory=list)  # each prompt's offset in the text sent
    utterances: Counter[str] = field(default_factory=Counter)  # finish reasons
    unmatched_ends: int = 0  # SegmentEnds that matched no prompt sent
    misplaced: int = 0  # UtteranceEnds whose source span does not hold their source_text
    call: Call = field(default_factory=Call)
    load: str = ""
    bulk_audio_s: float = 0.0
    bulk_errors: list[str] = field(default_factory=list)


class Listener:
    """The route stream's events, into its prompts."""

    def __init__(self, run: NavRun, stream: PushStream) -> None:
        self.run, self.stream, self.playout = run, stream, Playout()
        self.first_chunk: dict[int, float] = {}  # utterance_index -> its first chunk's arrival
        self.heard: dict[int, tuple[float, float]] = {}  # utterance_index -> playout [start, end)
        self.by_text = {(p.name, p.text): p for p in run.prompts}

    def __call__(self, event: Event, now: float) -> None:
        if isinstance(event, AudioChunkEvent):
            index = event.utterance_index
            self.first_chunk.setdefault(index, now)
            start = self.playout.play(now, event.duration_s)
            self.heard[index] = (self.heard.get(index, (start, 0.0))[0], start + event.duration_s)
        elif isinstance(event, UtteranceEndEvent):
            self.utterance_end(event)
        elif isinstance(event, SegmentEndEvent):
            found = self.by_text.get((event.name, event.text.strip()))
            if found is None:
                self.run.unmatched_ends += 1
            else:
                found.outcomes.append(event.outcome.replace("_", " "))
                found.revision = event.revision

    def utterance_end(self, end: UtteranceEndEvent) -> None:
        run = self.run
        run.utterances[end.finish_reason] += 1
        if self.stream.sent_text[end.source_start : end.source_end] != end.source_text:
            run.misplaced += 1
        i = bisect.bisect_right(run.starts, end.source_start) - 1
        arrived = self.first_chunk.get(end.utterance_index)
        if i < 0 or arrived is None or not end.num_samples or end.source_end == 0:
            return
        prompt = run.prompts[i]
        assert prompt.sent_at is not None
        if prompt.first_audio_s is None:
            prompt.first_audio_s = arrived - prompt.sent_at
        start, stop = self.heard[end.utterance_index]
        old = prompt.heard_s
        prompt.heard_s = (start, stop) if old is None else (old[0], max(old[1], stop))


async def send_route(stream: PushStream, run: NavRun) -> None:
    started = time.perf_counter()
    for prompt in run.prompts:
        await asyncio.sleep(max(0.0, started + prompt.at_s - time.perf_counter()))
        run.starts.append(len(stream.sent_text))
        prompt.sent_at, text = time.perf_counter(), prompt.text + " "
        if prompt.if_started:  # a replace flushes its text
            stream.replace(prompt.name, text, prompt.if_started, prompt.expires_in_ms)
        else:
            stream.segment(prompt.name, text, prompt.expires_in_ms)
            stream.flush()
    stream.end_input()


async def navigate(client: AsyncTTSClient, args: argparse.Namespace) -> NavRun:
    """The route on one stream; the prompts' outcomes and first audio."""
    run = NavRun(route(args.junctions, args.junction_interval_s), load=load_line())
    config = make_config(
        seed=7,
        max_new_tokens=args.prompt_max_new_tokens,
        min_new_tokens=args.prompt_min_new_tokens,
        pace_lead_s=args.pace_lead_s or None,
    )
    config.priority = tts_pb2.PRIORITY_INTERACTIVE
    stream = client.open_stream(config=config, timeout=args.timeout_s)
    sender = asyncio.create_task(send_route(stream, run))
    try:
        await record(stream, run.call, Listener(run, stream))
    finally:
        sender.cancel()
    run.load += " -> " + load_line().removeprefix("load average ")
    before: dict[str, Prompt] = {}
    for prompt in run.prompts:
        prior = before.get(prompt.name)
        if prompt.if_started and prior and prior.heard_s and prompt.sent_at is not None:
            prompt.old_audible = prior.heard_s[1] > prompt.sent_at
            prompt.cut_missed = (
                prompt.old_audible and prompt.if_started == "cut" and prior.outcome == "spoken"
            )
        before[prompt.name] = prompt
    return run


async def measure(target: str, args: argparse.Namespace) -> NavRun:
    async with AsyncTTSClient(target) as client:
        bulk_audio = [0.0]

        def on_bulk(event: Event, now: float) -> None:
            bulk_audio[0] += event.duration_s if isinstance(event, AudioChunkEvent) else 0.0

        interval_s = args.word_interval_ms / 1000
        bulk = caption_backlog(
            client, args.bulk, interval_s, args.bulk_max_new_tokens, on_event=on_bulk
        )
        await asyncio.sleep(args.settle_s)  # every caption stream is speaking
        try:
            run = await navigate(client, args)
        finally:  # cancelled, not half-closed: a half-closed stream would speak its backlog
            for task in bulk:
                task.cancel()
            ended = await asyncio.gather(*bulk, return_exceptions=True)
        run.bulk_audio_s = bulk_audio[0]
        run.bulk_errors = [
            f"{c.status}: {c.detail}" for c in ended if isinstance(c, Call) and not c.ok
        ]
    return run


HEADER = ["prompt kind", "sent", *OUTCOMES, "late", "first audio p50 (s)", "p95 (s)", "max (s)"]
HEADER += ["late as heard", "heard p95 (s)", "old still heard", "CUT heard in full"]


def kind_rows(run: NavRun) -> list[list[object]]:
    """Per kind of prompt, then all: sent, the outcomes, late, first audio p50/p95/max, ..."""
    rows: list[list[object]] = []
    for kind in [*KINDS, "all"]:
        prompts = [p for p in run.prompts if kind in ("all", p.kind)]
        if not prompts:
            continue
        outcomes = Counter(p.outcome for p in prompts)
        firsts = [p.first_audio_s for p in prompts if p.first_audio_s is not None]
        heard = [p.heard_after_s for p in prompts if p.heard_after_s is not None]
        late_heard = [p for p in prompts if (p.heard_after_s or 0.0) > p.deadline_s]
        figures = [pct(firsts, 50), pct(firsts, 95), max(firsts, default=float("nan"))]
        rows.append(
            [kind, len(prompts), *(outcomes[o] for o in OUTCOMES), sum(p.late for p in prompts)]
            + [f"{value:.2f}" for value in figures]
            + [len(late_heard), f"{pct(heard, 95):.2f}", sum(p.old_audible for p in prompts)]
            + [sum(p.cut_missed for p in prompts)]
        )
    return rows


def anomalies(run: NavRun) -> list[str]:
    """What breaks the contract as the client sees it (reported, not asserted)."""
    silent = ("replaced", "expired", "not spoken")
    counts = {
        "prompts got more than one SegmentEnd": sum(len(p.outcomes) > 1 for p in run.prompts),
        "prompts had audio yet ended replaced/expired/not spoken": sum(
            p.first_audio_s is not None and p.outcome in silent for p in run.prompts
        ),
        "UtteranceEnds' source spans did not hold their source_text": run.misplaced,
        "SegmentEnds matched no prompt sent": run.unmatched_ends,
    }
    notes = [f"{n} {what}" for what, n in counts.items() if n]
    if not run.call.ok:
        notes.append(f"the navigation stream failed: {run.call.status} {run.call.detail}")
    if run.bulk_errors:
        notes.append(f"caption stream errors: {run.bulk_errors[:3]}")
    return notes


def timeline(run: NavRun) -> str:
    t0 = min((p.sent_at for p in run.prompts if p.sent_at is not None), default=0.0)
    lines = []
    for p in run.prompts:
        first = "-" if p.first_audio_s is None else f"+{p.first_audio_s:.2f} s"
        heard = "-" if p.heard_after_s is None else f"+{p.heard_after_s:.2f} s"
        at = float("nan") if p.sent_at is None else p.sent_at - t0
        lines.append(
            f"{at:7.2f} s {p.name:>6} rev {p.revision} {p.kind:<13} first audio {first:>9} "
            f"heard {heard:>9} {p.outcome:<10} {'LATE ' if p.late else ''}{p.text}"
        )
    return "\n".join(lines)


def report(args: argparse.Namespace, run: NavRun) -> str:
    """Prints the figures; returns them as markdown."""
    setup = (
        f"{len(run.prompts)} prompts on a stream paced {args.pace_lead_s:g} s ahead (0: unpaced) "
        f"beside {args.bulk} caption streams, {args.model_dir or args.dev_model} model on "
        f"{args.device}"
    )
    rows, notes = kind_rows(run), anomalies(run)
    total = dict(zip(HEADER, rows[-1], strict=True))
    text = f"""# Navigation prompts under a caption backlog

{setup}. Command: {command()}. Load: {run.load}.

{table(HEADER, rows)}

Navigation utterances by finish reason: {dict(run.utterances)}; the caption streams got
{run.bulk_audio_s:.0f} s of audio. {" ".join(n + "." for n in notes) or "No contract anomaly seen by the client."}
See the docstring of bench/bench_navigation.py for what each column counts.

<details><summary>Every prompt: sent at, first audio and first heard (from its send), outcome</summary>

```
{timeline(run)}
```
</details>
"""
    print(text if args.timeline else text.split("<details>")[0])
    print(
        f"RESULT: {total['sent']} prompts: {total['late']} late, {total['replaced']} replaced, "
        f"{total['cut']} cut, {total['expired']} expired, {total['not spoken']} not spoken, "
        f"{total['no SegmentEnd']} without SegmentEnd; first audio p50 "
        f"{total['first audio p50 (s)']} s, p95 {total['p95 (s)']} s [{load_line()}]"
    )
    return text


def parse_args() -> argparse.Namespace:
    # fmt: off
    parser = arguments(__doc__, "2 junctions, 2 captions; no file")
    parser.add_argument("--junctions", type=int, default=10)
    parser.add_argument("--junction-interval-s", type=float, default=12.0, help="holds 4 prompts of ~2 s audio")
    parser.add_argument("--bulk", type=int, default=16, help="caption streams (PRIORITY_BULK)")
    parser.add_argument("--reserved", type=int, default=1, help="--reserved-slots")
    parser.add_argument("--word-interval-ms", type=int, default=30, help="captions' (~10x voice)")
    parser.add_argument("--pace-lead-s", type=float, default=0.5, help="the route's; 0: unpaced")
    parser.add_argument("--bulk-max-new-tokens", type=int, default=200)
    parser.add_argument("--prompt-max-new-tokens", type=int, default=100)
    parser.add_argument("--prompt-min-new-tokens", type=int, default=40)
    parser.add_argument("--settle-s", type=float, default=5.0, help="bulk start-up, unmeasured")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    add_bench_server_arguments(parser)
    parser.add_argument("--timeline", action="store_true", help="print every prompt's fate")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "navigation.md")
    # fmt: on
    args = parser.parse_args()
    if args.smoke:
        args.junctions, args.junction_interval_s, args.bulk = 2, 3.0, 2
        args.settle_s, args.bulk_max_new_tokens = 1.0, 40
        args.prompt_max_new_tokens, args.prompt_min_new_tokens = 30, 10
    return args


def main() -> None:
    args = parse_args()
    slots = [str(args.bulk + args.reserved), str(args.reserved), str(args.bulk + 1)]
    server_args = ["--max-streams", slots[0], "--reserved-slots", slots[1], "--max-queue", slots[2]]
    with bench_server(args, server_args) as target:
        run = asyncio.run(measure(target, args))
    markdown = report(args, run)
    if not args.smoke:
        write_result(args.out, markdown)
    if not run.call.ok or not any(p.first_audio_s is not None for p in run.prompts):
        sys.exit(1)


if __name__ == "__main__":
    main()
