"""What the benchmarks share: calls through the client library, load, figures, reports, captions.

Import it before chattts_*: it puts client/, server/ and tools/ on sys.path, so a benchmark runs
as `python bench/<name>.py` from a checkout. Calls go through the shipped client library (what
users run), not raw stubs. Every figure is printed with `load_line()` beside it: the machines
are shared, and a figure without its load cannot be read. Servers: `launch` (a `chattts-server`
subprocess on a free loopback port), `bench_server` and `add_bench_server_arguments` (--target,
--dev-model, --model-dir, --device, --server-arg, --server-log), from chattts_devtools.launcher.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "dev-models"
"""The dev-model cache the tests and benchmarks share."""
for _path in ("tools", "server", "client"):
    if str(REPO / _path) not in sys.path:
        sys.path.insert(0, str(REPO / _path))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from chattts_client import AsyncTTSClient, AudioChunkEvent, Event, PushStream, make_config  # noqa: E402
from chattts_devtools.launcher import add_bench_server_arguments as add_bench_server_arguments  # noqa: E402
from chattts_devtools.launcher import bench_server as bench_server  # noqa: E402
from chattts_devtools.launcher import launch as launch  # noqa: E402
from chattts_proto.chattts.v1 import tts_pb2  # noqa: E402

CAPTION_TEXT = (
    "so what we are seeing here is that the traffic on the ring road is building up again "
    "and if you are heading into the city this evening you should expect delays of around "
    "twenty minutes near the bridge where the right lane is still closed for repairs so "
    "consider taking the northern route instead"
)
CAPTION = CAPTION_TEXT.split()
"""Live captions: ASR words without punctuation."""

# -- figures and reports ------------------------------------------------------------------------


def arguments(doc: str | None, smoke: str) -> argparse.ArgumentParser:
    """A benchmark's parser: the docstring's first line, and --smoke (what it does: `smoke`)."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=smoke)
    return parser


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def load_line() -> str:
    """Like "load average 1.23 0.98 0.80 (16 CPUs)"."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({len(os.sched_getaffinity(0))} CPUs)"


def command() -> str:
    return f"`python {' '.join(sys.argv)}`"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table; floats as given (format them first), None as '-'."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in row) + " |")
    return "\n".join(lines)


def write_result(path: Path | str, text: str) -> None:
    """Written whole (a run killed mid-write keeps the previous file), then 'wrote PATH'."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"wrote {path}", flush=True)


def gauges(metrics_port: int, names: Iterable[str]) -> dict[str, float]:
    """A server's Prometheus gauges (unlabelled), read now; nan for one it does not show."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = {name: re.search(rf"^{name} (\S+)$", text, re.M) for name in names}
    return {name: float(m.group(1)) if m else float("nan") for name, m in found.items()}


def proc_mib(pid: int, field_name: str = "VmRSS") -> float:
    """A /proc/<pid>/status memory field in MiB; nan once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    line = next((ln for ln in text.splitlines() if ln.startswith(field_name + ":")), "")
    return int(line.split()[1]) / 1024 if line else float("nan")


def server_log_facts(log: str) -> tuple[float, str, float]:
    """From a server's log: engine ready s (load, GGUF, warm-up), its "GPT: ..." line, the GPT's
    build s."""
    ready = re.search(r"engine ready in (\d+\.\d+) s", log)
    gpt = re.search(r"GPT: (.*), built in (\d+\.\d+) s", log)
    return (
        float(ready.group(1)) if ready else float("nan"),
        gpt.group(1) if gpt else "?",
        float(gpt.group(2)) if gpt else float("nan"),
    )


# -- calls --------------------------------------------------------------------------------------


@dataclass
class Call:
    """One call as its client saw it; times in seconds after `started` (perf_counter)."""

    started: float = field(default_factory=time.perf_counter)
    arrivals: list[float] = field(default_factory=list)  # each audio chunk's arrival
    durations: list[float] = field(default_factory=list)  # each audio chunk's audio seconds
    total_s: float = float("nan")  # to the end of the response stream
    status: str = "OK"  # the gRPC status code's name, or the exception's type
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def ttfa_s(self) -> float | None:
        return self.arrivals[0] if self.arrivals else None

    @property
    def audio_s(self) -> float:
        return sum(self.durations)

    @property
    def rtf(self) -> float | None:
        return self.total_s / self.audio_s if self.audio_s > 0 else None

    @property
    def gap_free_s(self) -> float:
        """Earliest playback start (s after the call) that never runs out of audio: chunk i
        arrives at arrivals[i] and is needed at start + sum(durations[:i])."""
        before, worst = 0.0, 0.0
        for arrival, duration in zip(self.arrivals, self.durations, strict=True):
            worst = max(worst, arrival - before)
            before += duration
        return worst if self.arrivals else self.total_s

    def audio_between(self, start: float, end: float) -> float:
        """Audio seconds that arrived in [start, end) (perf_counter times)."""
        pairs = zip(self.arrivals, self.durations, strict=True)
        return sum(d for a, d in pairs if start <= self.started + a < end)

    def gaps_between(self, start: float, end: float) -> list[float]:
        """Seconds between consecutive chunks that arrived in [start, end)."""
        times = [a for a in self.arrivals if start <= self.started + a < end]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


OnEvent = Callable[[Event, float], None]
"""Sees every event of a call (marks, word timings, utterance ends) and its perf_counter time."""


class Playout:
    """When a listener who plays the stream in real time from its first chunk hears each chunk:
    each plays once the one before it has ended, or when it arrives if the player ran dry."""

    def __init__(self) -> None:
        self.end_s: float | None = None

    def play(self, arrival_s: float, seconds: float) -> float:  # -> its first sample's
        start_s = arrival_s if self.end_s is None else max(arrival_s, self.end_s)
        self.end_s = start_s + seconds
        return start_s


async def record(events: AsyncIterator[Event], call: Call, on_event: OnEvent | None = None) -> Call:
    """Iterate `events` into `call` until the stream ends or fails (the status says which)."""
    try:
        async for event in events:
            now = time.perf_counter()
            if isinstance(event, AudioChunkEvent):
                call.arrivals.append(now - call.started)
                call.durations.append(event.duration_s)
            if on_event is not None:
                on_event(event, now)
    except grpc.aio.AioRpcError as exc:
        call.status, call.detail = exc.code().name, exc.details() or ""
    except (asyncio.TimeoutError, OSError, RuntimeError) as exc:
        call.status, call.detail = type(exc).__name__, str(exc)
    call.total_s = time.perf_counter() - call.started
    return call


async def synthesize(
    client: AsyncTTSClient,
    text: str,
    config: tts_pb2.SynthesisConfig | None = None,
    *,
    timeout_s: float = 900,
    on_event: OnEvent | None = None,
) -> Call:
    """One `AsyncTTSClient.synthesize` call."""
    call = Call()
    return await record(client.synthesize(text, config=config, timeout=timeout_s), call, on_event)


async def _feed(
    stream: PushStream,
    words: Iterable[str],
    interval_s: float,
    stop: asyncio.Event | None,
    sent_at: list[float] | None,
) -> None:
    """A word (and a space) every `interval_s` on an absolute schedule, so the pace does not
    drift with the loop's delays, until the words or `stop` run out; then end the input."""
    t0 = time.perf_counter()
    for i, word in enumerate(words):
        delay_s = t0 + i * interval_s - time.perf_counter()
        if delay_s > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for((stop or asyncio.Event()).wait(), delay_s)
        if (stop is not None and stop.is_set()) or stream.input_ended:
            break
        if sent_at is not None:
            sent_at.append(time.perf_counter())
        stream.push(word + " ")
    if not stream.input_ended:
        stream.end_input()


async def push_words(
    client: AsyncTTSClient,
    words: Iterable[str],
    config: tts_pb2.SynthesisConfig | None = None,
    interval_s: float = 0.0,
    *,
    stop: asyncio.Event | None = None,
    timeout_s: float = 900,
    on_event: OnEvent | None = None,
    sent_at: list[float] | None = None,
) -> Call:
    """One PushStream (a caption, an LLM): each word (and a space) every `interval_s`, then
    half-close and read the rest. The call's times run from its first word."""
    stream = client.open_stream(config=config, timeout=timeout_s)
    call = Call()
    sender = asyncio.create_task(_feed(stream, words, interval_s, stop, sent_at))
    try:
        await record(stream, call, on_event)
    finally:
        sender.cancel()
    return call


def caption_backlog(
    client: AsyncTTSClient,
    num_streams: int,
    interval_s: float,
    max_new_tokens: int,
    *,
    stop: asyncio.Event | None = None,
    on_event: OnEvent | None = None,
) -> list[asyncio.Task[Call]]:
    """PRIORITY_BULK caption streams (stream i from word 7i, seed i), a word every `interval_s`
    each, until `stop` (then each half-closes and speaks the rest) or cancelled."""
    tasks = []
    for i in range(num_streams):
        config = make_config(seed=i, max_new_tokens=max_new_tokens)
        config.priority = tts_pb2.PRIORITY_BULK
        # No punctuation: release every few words, as live captions need.
        policy = tts_pb2.TextReleasePolicy(first_words=4, max_words=12, idle_ms=600)
        config.text_release.CopyFrom(policy)
        words = itertools.islice(itertools.cycle(CAPTION), 7 * i, None)
        call = push_words(client, words, config, interval_s, stop=stop, on_event=on_event)
        tasks.append(asyncio.create_task(call))
    return tasks


# -- load ---------------------------------------------------------------------------------------


@dataclass
class Load:
    """Calls made `num_callers` at a time."""

    num_callers: int
    calls: list[Call] = field(default_factory=list)
    wall_s: float = float("nan")

    @property
    def ok(self) -> list[Call]:
        return [c for c in self.calls if c.ok]

    @property
    def errors(self) -> int:
        return len(self.calls) - len(self.ok)

    @property
    def throughput(self) -> float:
        """Audio seconds received per wall second, all callers together."""
        return sum(c.audio_s for c in self.ok) / self.wall_s if self.wall_s else float("nan")

    def figure(self, name: str) -> list[float]:
        """One figure (ttfa_s, gap_free_s, total_s, audio_s, rtf) of each call that has it."""
        values = (getattr(c, name) for c in self.ok)
        return [float(v) for v in values if v is not None]


async def run_load(num_callers: int, num_calls: int, one: Callable[[int], Awaitable[Call]]) -> Load:
    """`num_calls` calls, at most `num_callers` at once; `one(i)` makes call i."""
    load = Load(num_callers)
    gate = asyncio.Semaphore(max(1, num_callers))

    async def slot(i: int) -> Call:
        async with gate:
            return await one(i)

    started = time.perf_counter()
    load.calls = list(await asyncio.gather(*(slot(i) for i in range(num_calls))))
    load.wall_s = time.perf_counter() - started
    return load
