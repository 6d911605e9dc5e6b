"""Timing replicas that share a machine, for bench/bench_neighbours.py and
tests/e2e/test_replicas_under_load.py: one utterance through a server, several at once, and what
perfect sharing costs at this moment (single-threaded fixed-work processes run together)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

_FIXED_WORK = "import time\nt = time.perf_counter()\nfor _ in range({n}): pass\nprint(time.perf_counter() - t)"


def timed_utterance(
    target: str, text: str, seed: int, tokens: int, timeout: float
) -> tuple[float, float]:
    """Stream one utterance of exactly `tokens` audio tokens from the server at `target`:
    (wall seconds until its last chunk, audio seconds it carried)."""
    from chattts_client import TTSClient
    from chattts_proto.chattts.v1 import tts_pb2

    config = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=2),
        sampling=tts_pb2.Sampling(seed=seed, min_new_tokens=tokens, max_new_tokens=tokens),
    )
    client = TTSClient(target)
    try:
        started = time.perf_counter()
        stream = client.synthesize(text, config=config, timeout=timeout)
        for _ in stream:
            pass
        return time.perf_counter() - started, stream.stats.audio_s
    finally:
        client.close()


def at_once(run: Callable[[int], float], count: int, timeout: float | None = None) -> list[float]:
    """`run(0)` .. `run(count - 1)` in threads started together; their results in order (0.0
    for one still running after `timeout`)."""
    results = [0.0] * count

    def one(i: int) -> None:
        results[i] = run(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def fixed_work_s(copies: int, iterations: int = 12_000_000, timeout: float = 300) -> float:
    """Median wall time of `copies` single-threaded fixed-work processes (12M iterations: about
    0.5 s of one CPU) run at once: what perfect sharing costs on this machine now."""
    code = _FIXED_WORK.format(n=iterations)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(copies)
    ]
    return statistics.median(float(proc.communicate(timeout=timeout)[0]) for proc in procs)
