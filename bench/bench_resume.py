"""Resume: how long a listener waits when the connection drops mid-stream, and what a parked
stream holds (issue 49).

A `chattts-server` (tiny model unless --dev-model; default flags but --resume-window-s) behind a
real TCP relay (chattts_devtools.tcp_relay). Part one: --streams resumable streams in turn,
through the client library (`open_stream`), each cut --cuts times at random audio chunks; per
resume, from the failed read to the resumed call's answer (`ResumedEvent.gap_s`) and to the
first resumed audio chunk (p50, p95). Part two: --parked streams opened at once and cut, the
client then gone: the server's resident memory with them parked (their buffers full or their
text spoken) against before, per stream, and after their window. Part three: --streams streams
on one of two servers, each cut once at a random audio chunk while the relay sends the next
connection to the other server (a replica lost behind a proxy): the resume is refused there and
the stream goes on as a new one from the first word not wholly heard; from the failed read to
the new stream's answer and to its first audio (p50, p95). Prints, with the load.
"""

from __future__ import annotations

import asyncio
import random
import time

from _common import CACHE, arguments, gauges, launch, load_line, pct, proc_mib, table

from chattts_client import AsyncTTSClient, AudioChunkEvent, ResumedEvent, make_config
from chattts_devtools.launcher import ServerProcess
from chattts_devtools.tcp_relay import TcpRelay

TEXT = (
    "In three hundred meters, turn left onto the ring road. Keep right at the fork, then take "
    "the second exit toward the airport. Your destination is on the left after the bridge."
)


async def cut_stream(
    target: str, relay: TcpRelay, cuts: int, rng: random.Random, gaps: list[float]
) -> list[tuple[float, float]]:
    """One stream cut `cuts` times; per resume (gap to the answer, gap to the first audio).
    `gaps` gets the time between chunks elsewhere: what a listener waits with no cut."""
    resumes: list[tuple[float, float]] = []
    pending: ResumedEvent | None = None
    resumed_at = last_audio = 0.0
    async with AsyncTTSClient(target) as client:
        stream = client.open_stream(config=make_config(seed=1), timeout=300)
        stream.flush(TEXT)
        stream.end_input()
        countdown = rng.randint(1, 3)
        async for event in stream:
            now = time.perf_counter()
            if isinstance(event, ResumedEvent):
                pending, resumed_at = event, now
            elif isinstance(event, AudioChunkEvent):
                if pending is not None:
                    resumes.append((pending.gap_s, pending.gap_s + now - resumed_at))
                    pending = None
                elif last_audio:
                    gaps.append(now - last_audio)
                last_audio = now
                countdown -= 1
                if countdown == 0 and relay.cuts < cuts:
                    relay.cut()
                    countdown = rng.randint(1, 3)
    return resumes


async def lose_server(
    target: str, relay: TcpRelay, other_port: int, rng: random.Random
) -> tuple[float, float]:
    """One stream whose server is lost at a random audio chunk: (gap to the new stream's
    answer, gap to its first audio)."""
    went_on: ResumedEvent | None = None
    gaps: tuple[float, float] | None = None
    went_on_at, chunks, cut_at = 0.0, 0, rng.randint(1, 6)
    async with AsyncTTSClient(target) as client:
        stream = client.open_stream(config=make_config(seed=1), timeout=300)
        stream.flush(TEXT)
        stream.end_input()
        async for event in stream:  # to its end: a stream left open outlives its event loop
            if isinstance(event, ResumedEvent):
                went_on, went_on_at = event, time.perf_counter()
            elif isinstance(event, AudioChunkEvent):
                if went_on is not None and gaps is None:
                    gaps = went_on.gap_s, went_on.gap_s + time.perf_counter() - went_on_at
                chunks += 1
                if chunks == cut_at:
                    relay.retarget(other_port)
                    relay.cut()
    if gaps is None:
        raise SystemExit("a stream ended before its server was lost (or did not go on)")
    return gaps


def wait_gauge(metrics_port: int, name: str, value: float, timeout_s: float = 300) -> None:
    """Until the server's gauge `name` reads `value` (SystemExit after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while gauges(metrics_port, [name])[name] != value:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} did not reach {value} in {timeout_s} s")
        time.sleep(0.1)


async def park(target: str, relay: TcpRelay, count: int) -> None:
    """`count` streams that each got audio, then a cut with nobody left to resume them."""
    async with AsyncTTSClient(target) as client:
        streams = [
            client.open_stream(config=make_config(seed=i), timeout=300) for i in range(count)
        ]
        for stream in streams:
            stream.flush(TEXT)
        for stream in streams:
            async for event in stream:
                if isinstance(event, AudioChunkEvent):
                    break
        relay.cut()


def main() -> None:
    parser = arguments(__doc__, "two streams cut twice, two parked: checks the script")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--cuts", type=int, default=3, help="cuts per stream")
    parser.add_argument("--parked", type=int, default=8)
    parser.add_argument("--window-s", type=float, default=10.0, help="--resume-window-s")
    parser.add_argument("--dev-model", default="tiny")
    args = parser.parse_args()
    if args.smoke:
        args.streams, args.cuts, args.parked, args.window_s = 2, 2, 2, 2.0
    slots = max(args.parked, args.streams + 2)  # part three leaves a stream parked per stream
    server_args = ["--resume-window-s", str(args.window_s), "--max-streams", str(slots)]
    # One event loop for every part: grpc.aio's completion queue stays bound to the loop it
    # first ran on, and a loop per part left its late callbacks on a closed loop.
    with (
        asyncio.Runner() as runner,
        launch(server_args, dev_model=args.dev_model, cache=CACHE, metrics=True) as srv,
    ):
        srv.wait_serving()
        rng = random.Random(7)
        resumes: list[tuple[float, float]] = []
        gaps: list[float] = []
        for _ in range(args.streams):
            with TcpRelay(srv.port) as relay:
                resumes += runner.run(cut_stream(relay.target, relay, args.cuts, rng, gaps))
        print(f"{len(resumes)} resumes over {args.streams} streams; {load_line()}")
        answers, audio = [r[0] * 1000 for r in resumes], [r[1] * 1000 for r in resumes]
        uncut = [g * 1000 for g in gaps]
        rows = [
            (name, f"{pct(v, 50):.1f}", f"{pct(v, 95):.1f}")
            for name, v in (
                ("the failed read to the resumed call's answer", answers),
                ("the failed read to the first resumed audio", audio),
                ("one chunk to the next, no cut (for reference)", uncut),
            )
        ]
        print(table(["ms", "p50", "p95"], rows))
        port = srv.metrics_port
        wait_gauge(port, "chattts_parked_streams", 0)  # part one's, held for their window
        before = proc_mib(srv.proc.pid)
        with TcpRelay(srv.port) as relay:
            runner.run(park(relay.target, relay, args.parked))
        wait_gauge(port, "chattts_parked_streams", args.parked)
        wait_gauge(port, "chattts_kv_slots_in_use", 0)  # their text spoken into their buffers
        held = proc_mib(srv.proc.pid)
        wait_gauge(port, "chattts_parked_streams", 0)
        after = proc_mib(srv.proc.pid)
        per_stream = (held - before) / args.parked
        print(
            f"RESULT: resume p95 {pct(audio, 95):.1f} ms to the first resumed audio; "
            f"{args.parked} parked streams: RSS {before:.0f} -> {held:.0f} MiB "
            f"({per_stream:.1f} MiB each), {after:.0f} MiB after their window; {load_line()}"
        )
        print(elsewhere(runner, srv, server_args, args.streams, args.dev_model))


def elsewhere(
    runner: asyncio.Runner,
    first: ServerProcess,
    server_args: list[str],
    streams: int,
    dev_model: str,
) -> str:
    """Part three: streams on `first` go on on a second server (each leaves one parked on
    `first`)."""
    with launch(server_args, dev_model=dev_model, cache=CACHE) as second:
        second.wait_serving()
        rng = random.Random(11)
        lost: list[tuple[float, float]] = []
        for _ in range(streams):
            with TcpRelay(first.port) as relay:
                lost.append(runner.run(lose_server(relay.target, relay, second.port, rng)))
    answers, audio = [r[0] * 1000 for r in lost], [r[1] * 1000 for r in lost]
    return (
        f"RESULT: {streams} streams went on elsewhere: the failed read to the new stream's "
        f"answer p50 {pct(answers, 50):.1f} / p95 {pct(answers, 95):.1f} ms, to its first "
        f"audio p50 {pct(audio, 50):.1f} / p95 {pct(audio, 95):.1f} ms; {load_line()}"
    )


if __name__ == "__main__":
    main()
