"""Continuous batching does not change what a seeded request generates, and memory stays flat.

- 8 seeded requests of different lengths (fixed via min = max new tokens) run together, joining
  at different steps, give the same codes as each run alone.
- Every step is one GPT forward, however many prompts join while others decode.
- After warm-up, hundreds of short requests allocate no new KV cache / history tensors and the
  process RSS barely grows.
"""

from __future__ import annotations

import gc
import os
from dataclasses import replace

import numpy as np
import pytest

from chattts_server.engine.core import EngineCore
from chattts_server.engine.utterance import (
    ChunkingOptions,
    SamplingParams,
    UtteranceRequest,
    VoiceKind,
    VoiceSpec,
)
from engine_run import make_runner, run_core

LENGTHS = [12, 60, 20, 44, 16, 52, 28, 36]
"""Tokens per request (min = max); kept small so the sequential 'alone' runs fit the time."""
TEXTS = [
    "the first one.",
    "a second and much longer sentence with more words in it.",
    "third.",
    "number four is here.",
    "five is short.",
    "six has quite a few words to say about nothing much.",
    "seven.",
    "eight and the last of them all.",
]


WHOLE = 64


def request(i: int, n: int | None = None, seed: int | None = None) -> UtteranceRequest:
    n = LENGTHS[i] if n is None else n
    return UtteranceRequest(
        request_id=f"r{i}",
        text=TEXTS[i % len(TEXTS)],
        voice=VoiceSpec(VoiceKind.SEED, seed=i),
        speed=i % 10,
        sampling=SamplingParams(
            seed=100 + i if seed is None else seed, min_new_tokens=n, max_new_tokens=n
        ),
        # One audio chunk at the end: the codes are under test here, and per-chunk vocoding
        # would dominate the run time on a small CPU.
        chunking=ChunkingOptions(first_chunk_tokens=WHOLE, max_chunk_tokens=WHOLE),
    )


@pytest.fixture(scope="module")
def runner_and_config(tiny_model_dir):
    runner, config = make_runner(tiny_model_dir, max_streams=8, max_tokens=256)
    runner.warmup(config.max_streams)
    return runner, config


def test_concurrent_equals_alone(runner_and_config):
    runner, config = runner_and_config
    alone = {}
    for i in range(len(LENGTHS)):
        res = run_core(EngineCore.from_config(runner, config), {0: [request(i)]})[f"r{i}"]
        assert res.codes is not None and res.codes.shape == (LENGTHS[i], 4)
        alone[i] = res.codes
    # Together: staggered joins, so rows sit at different positions and slots.
    joins: dict[int, list[UtteranceRequest]] = {}
    for i in range(len(LENGTHS)):
        joins.setdefault((i * 3) % 11, []).append(request(i))
    results = run_core(EngineCore.from_config(runner, config), joins)
    for i in range(len(LENGTHS)):
        np.testing.assert_array_equal(results[f"r{i}"].codes, alone[i], err_msg=f"request {i}")


def test_each_step_is_one_forward(runner_and_config, monkeypatch):
    """Prompts that arrive together prefill in one forward, with the decode batch of the
    requests already running: no prompt waits behind another's prefill."""
    runner, config = runner_and_config
    rows_per_forward: list[int] = []
    real_forward = runner.gpt.llama._forward

    def counted(x, positions, attention, capture=None):
        rows_per_forward.append(len(x))
        return real_forward(x, positions, attention, capture)

    monkeypatch.setattr(runner.gpt.llama, "_forward", counted)
    core = EngineCore.from_config(runner, config)
    prompt_lens: dict[str, int] = {}
    joins = {0: [request(0, n=8)], 3: [request(i, n=8) for i in range(1, 5)]}
    for step in range(40):
        for req in joins.get(step, []):
            prompt_lens[req.request_id] = core.add_request(req).prompt_len
        rows_per_forward.clear()
        outputs = core.step()
        assert all(out.error is None for out in outputs)
        assert len(rows_per_forward) <= 1, f"step {step} ran {len(rows_per_forward)} forwards"
        if step == 3:
            # Four whole prompts and the one decode row of the request that joined first.
            assert rows_per_forward == [sum(prompt_lens[f"r{i}"] for i in range(1, 5)) + 1]
        if not core.has_unfinished_requests:
            break
    assert not core.has_unfinished_requests


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_flat_over_many_requests(runner_and_config):
    runner, config = runner_and_config
    kv, kv_ptr = runner.gpt.cache.kv, runner.gpt.cache.kv.data_ptr()
    hist, hist_ptr = (
        runner.code_sampler.history.tokens,
        runner.code_sampler.history.tokens.data_ptr(),
    )

    def run_batch(start: int, count: int, n: int) -> None:
        reqs = [
            replace(request(start + k, n=n, seed=start + k), request_id=f"m{start + k}")
            for k in range(count)
        ]
        results = run_core(EngineCore.from_config(runner, config), {0: reqs})
        assert all(res.codes is not None and res.codes.shape == (n, 4) for res in results.values())

    run_batch(0, 10, 16)  # the first 10 requests
    gc.collect()
    rss_10 = _rss_bytes()
    done = 10
    while done < 200:
        count = min(50, 200 - done)
        run_batch(done, count, 6)
        done += count
    gc.collect()
    rss_200 = _rss_bytes()
    growth_mb = (rss_200 - rss_10) / 2**20
    print(
        f"RSS after 10 requests {rss_10 / 2**20:.1f} MiB, after 200 {rss_200 / 2**20:.1f} MiB, growth {growth_mb:+.1f} MiB"
    )
    assert runner.gpt.cache.kv is kv and runner.gpt.cache.kv.data_ptr() == kv_ptr
    assert runner.code_sampler.history.tokens is hist and hist.data_ptr() == hist_ptr
    assert not runner._slots, "runner kept per-request state"
    assert growth_mb < 50
