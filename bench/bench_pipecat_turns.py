"""Pipecat turn ends on a loaded server: how long after a turn's last audio frame its stop frame.

The Pipecat adapter ends a turn when the stream's mark for it comes back, right after the
turn's last audio (issue 26: within 50 ms of its last audio chunk, where timers took 0.3-8 s).
Here a real Pipecat pipeline (`pipecat.tests.utils.run_test`, in the client venv the Pipecat
tests use: pipecat-ai pins protobuf<7) speaks `--turns` LLM replies one after another on one
stream, while `--load-streams` other streams keep the server busy. An observer stamps each
TTSAudioRawFrame and TTSStoppedFrame the service pushes; per turn it reports the stop frame's
delay after the turn's last audio frame, and the turn's time to first audio, which shows the
load.

The server is `chattts-server` (a subprocess, tiny random-weight dev model unless --model-dir or
--target), on loopback. Prints its figures; writes nothing.

Usage: python bench/bench_pipecat_turns.py [--turns 8] [--load-streams 3] [--max-new-tokens 60]
       [--target HOST:PORT | --dev-model tiny|full | --model-dir DIR] [--device cpu|cuda]
       [--pipecat-python PATH]
       python bench/bench_pipecat_turns.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

import grpc  # noqa: E402

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402

TARGET_MS = 50.0
LOAD_TEXT = "A sentence that keeps the server busy while the agent speaks its turns."
REPLIES = [
    "Sure, I can help with that.",
    "The train leaves at nine. It takes two hours.",
    "Yes.",
    "Let me check the schedule for you. One moment.",
]

# The agent side, run by the client venv's python: turns one after another, each after the
# previous one stopped; one JSON line per turn with the observer's stamps (perf_counter s).
_AGENT = r"""
import asyncio, json, sys, time
from loguru import logger
logger.remove()
from pipecat.frames.frames import (LLMFullResponseEndFrame, LLMFullResponseStartFrame,
    LLMTextFrame, TTSAudioRawFrame, TTSStoppedFrame)
from pipecat.observers.base_observer import BaseObserver
from pipecat.tests.utils import SleepFrame, run_test
from chattts_client import SynthesisOptions
from chattts_client.pipecat import ChatTTSTTSService

target, num_tokens, replies = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])

class Stamps(BaseObserver):
    def __init__(self, tts):
        super().__init__()
        self.tts, self.turns = tts, {}

    async def on_push_frame(self, data):
        frame, now = data.frame, time.perf_counter()
        if data.source is not self.tts or not getattr(frame, "context_id", None):
            return
        turn = self.turns.setdefault(frame.context_id, {})
        if isinstance(frame, TTSAudioRawFrame):
            turn.setdefault("first_audio", now)
            turn["last_audio"] = now
        elif isinstance(frame, TTSStoppedFrame):
            turn["stopped"] = now

def tokens(text):
    words = text.split(" ")
    return [LLMTextFrame(w + (" " if i < len(words) - 1 else "")) for i, w in enumerate(words)]

async def main():
    options = SynthesisOptions(voice=7, seed=3, max_new_tokens=num_tokens)
    tts = ChatTTSTTSService(target, options)
    stamps = Stamps(tts)
    sent = []

    def frames():
        for text in replies:
            sent.append(time.perf_counter())
            yield LLMFullResponseStartFrame()
            yield from tokens(text)
            yield LLMFullResponseEndFrame()
            done = len(sent)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and sum(
                    "stopped" in t for t in stamps.turns.values()) < done:
                yield SleepFrame(sleep=0.01)

    await run_test(tts, frames_to_send=frames(), observers=[stamps])
    for start, turn in zip(sent, stamps.turns.values()):
        print(json.dumps({"sent": start, **turn}))

asyncio.run(main())
"""


async def _load(target: str, stop: asyncio.Event, max_new_tokens: int) -> int:
    """Streams back to back until `stop`: the other callers of a busy server."""
    config = tts_pb2.SynthesisConfig(sampling=tts_pb2.Sampling(max_new_tokens=max_new_tokens))
    done = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        while not stop.is_set():
            request = tts_pb2.SynthesizeRequest(text=LOAD_TEXT, config=config)
            async for _ in stub.Synthesize(request, timeout=600):
                if stop.is_set():
                    break
            done += 1
    return done


def _pipecat_python(given: str | None) -> Path:
    if given:
        return Path(given)
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from clientvenv import PIPECAT_AI, client_floor_pins, client_venv

    return client_venv("pipecat", [*client_floor_pins(), PIPECAT_AI])


async def measure(target: str, args: argparse.Namespace) -> tuple[list[dict[str, float]], int]:
    stop = asyncio.Event()
    load = [
        asyncio.create_task(_load(target, stop, args.max_new_tokens))
        for _ in range(args.load_streams)
    ]
    replies = [REPLIES[i % len(REPLIES)] for i in range(args.turns)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(REPO / "client"), PYTHONUNBUFFERED="1")
    agent = await asyncio.create_subprocess_exec(
        str(_pipecat_python(args.pipecat_python)),
        "-c",
        _AGENT,
        target,
        str(args.max_new_tokens),
        json.dumps(replies),
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await agent.communicate()
    stop.set()
    load_done = sum(await asyncio.gather(*load))
    if agent.returncode != 0:
        raise SystemExit(f"the Pipecat agent failed ({agent.returncode})")
    turns = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return turns, load_done


def report(args: argparse.Namespace, turns: list[dict[str, float]], load_done: int) -> bool:
    print(
        f"{args.turns} Pipecat turns on one stream, {args.load_streams} load stream(s) beside "
        f"it ({load_done} load utterances done), max_new_tokens={args.max_new_tokens}"
    )
    gaps_ms = []
    for i, t in enumerate(turns):
        if "last_audio" not in t or "stopped" not in t:
            print(f"turn {i}: no audio or no stop frame: {sorted(t)}")
            continue
        gap_ms = (t["stopped"] - t["last_audio"]) * 1000
        gaps_ms.append(gap_ms)
        print(
            f"turn {i}: first audio {t['first_audio'] - t['sent']:.2f} s after its text, "
            f"stop frame {gap_ms:.1f} ms after its last audio frame"
        )
    if not gaps_ms:
        print("RESULT: no turn ended with audio")
        return False
    worst = max(gaps_ms)
    print(
        f"RESULT: turn end after last audio median {statistics.median(gaps_ms):.1f} ms, "
        f"max {worst:.1f} ms over {len(gaps_ms)} turns (target {TARGET_MS:.0f} ms: "
        f"{'met' if worst <= TARGET_MS else 'missed'})"
    )
    return len(gaps_ms) == args.turns


def main() -> None:
    from chattts_devtools.launcher import add_bench_server_arguments, bench_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--load-streams", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=60, help="per utterance, at most")
    add_bench_server_arguments(parser)
    parser.add_argument("--pipecat-python", help="a python with pipecat-ai (default: test venv)")
    parser.add_argument("--smoke", action="store_true", help="2 turns, 1 load stream")
    args = parser.parse_args()
    if args.smoke:
        args.turns, args.load_streams, args.max_new_tokens = 2, 1, 24

    with bench_server(args) as target:
        turns, load_done = asyncio.run(measure(target, args))
    if not report(args, turns, load_done):
        sys.exit(1)


if __name__ == "__main__":
    main()
