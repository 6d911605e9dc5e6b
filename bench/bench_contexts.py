"""One WebSocket with N contexts against N WebSockets with one stream each (issue 50).

A `chattts-server` (tiny model unless --dev-model; --max-streams and --ws-max-contexts N) with
its HTTP door. Each round runs the same N texts (fixed-length sentences, so the audio is the
same) both ways, the ways taking turns so that load from other processes hits both alike: on
one socket as N contexts (the client library's `ContextSocket`: a config, the text and
close_context each), and on N sockets at once (a config, the text and end each). Per stream, the first audio from when its text was sent;
per way, the audio seconds made over the wall time from the first connect to the last close
(throughput). Prints the medians over --rounds rounds, contexts / sockets, with the load.

Usage: python bench/bench_contexts.py [--streams 8] [--rounds 3] [--tokens 60]
       python bench/bench_contexts.py --smoke   # two streams, one round
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from _common import CACHE, arguments, launch, load_line, pct, table
from websockets.asyncio.client import connect

from chattts_client.ws_contexts import Context, ContextAudio, ContextSocket

TEXTS = [
    "Turn left at the next light.",
    "Your table is ready now.",
    "The meeting starts at ten.",
    "Keep right at the fork.",
    "Your order has shipped today.",
    "Please hold for a moment.",
    "The train leaves from platform two.",
    "Rain is expected this evening.",
]


def _config(args, n: int) -> dict:  # type: ignore[no-untyped-def]
    sampling = {"seed": n, "min_new_tokens": args.tokens, "max_new_tokens": args.tokens}
    return {"voice": f"seed:{n + 1}", "audio_format": "pcm", "sampling": sampling}


class Tally:
    """First audio per stream (seconds after its text was sent), and the audio received."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.first_audio: dict[str, float] = {}
        self.audio_s = 0.0

    def audio(self, key: str, pcm_bytes: int) -> None:
        if key not in self.first_audio:
            self.first_audio[key] = time.perf_counter() - self.sent[key]
        self.audio_s += pcm_bytes / 2 / 24000


async def _heard(context: Context, tally: Tally) -> None:
    """A context's audio, until its close (a refusal raises ContextError)."""
    async for event in context:
        if isinstance(event, ContextAudio):
            tally.audio(event.context_id, len(event.audio))


async def one_socket(url: str, args, texts: list[str]) -> tuple[Tally, float]:  # type: ignore[no-untyped-def]
    tally, started = Tally(), time.perf_counter()
    async with await ContextSocket.connect(url, audio_format="pcm") as ws:
        contexts = []
        for n, text in enumerate(texts):
            context = await ws.open(f"c{n}", **_config(args, n))
            tally.sent[context.context_id] = time.perf_counter()
            await context.send(text)
            await context.close()
            contexts.append(context)
        await asyncio.gather(*(_heard(context, tally) for context in contexts))
    return tally, time.perf_counter() - started


async def many_sockets(url: str, args, texts: list[str]) -> tuple[Tally, float]:  # type: ignore[no-untyped-def]
    tally, started = Tally(), time.perf_counter()

    async def one(n: int, text: str) -> None:
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "config", **_config(args, n)}))
            tally.sent[f"c{n}"] = time.perf_counter()
            await ws.send(json.dumps({"type": "text", "text": text}))
            await ws.send(json.dumps({"type": "end"}))
            async for message in ws:
                if isinstance(message, bytes):
                    tally.audio(f"c{n}", len(message))
                elif json.loads(message)["type"] == "error":
                    raise SystemExit(f"the server refused a stream: {message}")

    await asyncio.gather(*(one(n, text) for n, text in enumerate(texts)))
    return tally, time.perf_counter() - started


def main() -> None:
    parser = arguments(__doc__, "two streams, one round: checks the script")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=60, help="audio tokens a sentence")
    parser.add_argument("--dev-model", default="tiny")
    args = parser.parse_args()
    if args.smoke:
        args.streams, args.rounds, args.tokens = 2, 1, 12
    texts = (TEXTS * (1 + args.streams // len(TEXTS)))[: args.streams]
    flags = ["--max-streams", str(args.streams), "--ws-max-contexts", str(args.streams)]
    ways = {"contexts": one_socket, "sockets": many_sockets}
    first: dict[str, list[float]] = {way: [] for way in ways}
    rate: dict[str, list[float]] = {way: [] for way in ways}
    with launch(flags, dev_model=args.dev_model, cache=CACHE, http=True) as srv:
        srv.wait_serving()
        url = f"ws://127.0.0.1:{srv.http_port}/v1/audio/speech/stream"
        asyncio.run(many_sockets(url, args, texts[:1]))  # warm: not counted
        for r in range(args.rounds):
            for way in ways if r % 2 == 0 else reversed(list(ways)):
                tally, wall_s = asyncio.run(ways[way](url, args, texts))
                if len(tally.first_audio) != len(texts):
                    raise SystemExit(f"{way}: {len(tally.first_audio)} of {len(texts)} spoke")
                first[way].append(pct(list(tally.first_audio.values()), 50))
                rate[way].append(tally.audio_s / wall_s)
                print(f"  round {r + 1} {way}: first audio p50 {first[way][-1] * 1000:.0f} ms, "
                      f"{rate[way][-1]:.2f} s of audio a second; {load_line()}", flush=True)  # fmt: skip
    med = {way: (statistics.median(first[way]), statistics.median(rate[way])) for way in ways}
    rows = [[way, f"{f * 1000:.0f}", f"{t:.2f}"] for way, (f, t) in med.items()]
    print(table(["way", "first audio p50 ms", "audio s / s"], rows))
    (f_ctx, t_ctx), (f_sock, t_sock) = med["contexts"], med["sockets"]
    print(
        f"RESULT: {args.streams} contexts on one socket / {args.streams} sockets: first audio "
        f"{f_ctx / f_sock:.2f}x, throughput {t_ctx / t_sock:.2f}x (medians of {args.rounds} "
        f"rounds); {load_line()}"
    )


if __name__ == "__main__":
    main()
