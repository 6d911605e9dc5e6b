"""A stream that starts while many slots are in use gets its first audio sooner
(`BusyFirstChunk`): counted in engine steps on the tiny model, so the check does not depend on
the machine's speed (bench/bench_serving.py measures the seconds)."""

from __future__ import annotations

import torch

from chattts_server.config import EngineConfig
from chattts_server.engine.core import EngineCore
from chattts_server.engine.utterance import (
    RefineOptions,
    SamplingParams,
    UtteranceRequest,
    VoiceKind,
    VoiceSpec,
)
from chattts_server.model.loader import load_chattts
from engine_run import CPU, torch_runner

STREAMS = 16
TOKENS = 24


def first_audio_steps(model_dir, busy_batch: int, late: int = 0) -> dict[str, int]:
    """16 requests, the first at step 0 and the rest `late` steps later; the engine step at
    which each one's first audio came."""
    config = EngineConfig(
        max_streams=STREAMS, max_tokens=256, max_new_tokens=64, busy_batch=busy_batch
    )
    runner = torch_runner(load_chattts(model_dir, CPU, torch.float32), config)
    core = EngineCore.from_config(runner, config)
    requests = [
        UtteranceRequest(
            request_id=f"r{i}",
            text=f"stream number {i} says a few words.",
            voice=VoiceSpec(VoiceKind.SEED, seed=i),
            sampling=SamplingParams(seed=i, min_new_tokens=TOKENS, max_new_tokens=TOKENS),
            refine=RefineOptions(enabled=False),
        )
        for i in range(STREAMS)
    ]
    joins = {0: requests[:1], late: requests[1:]} if late else {0: requests}
    first: dict[str, int] = {}
    for step in range(1000):
        for request in joins.pop(step, []):
            core.add_request(request)
        if not (core.has_unfinished_requests or joins):
            break
        for out in core.step():
            assert out.error is None, out.error
            if out.audio and out.request_id not in first:
                first[out.request_id] = step
    assert len(first) == STREAMS
    return first


def test_under_load_first_audio_comes_eight_steps_sooner(tiny_model_dir) -> None:
    off = first_audio_steps(tiny_model_dir, busy_batch=0)
    on = first_audio_steps(tiny_model_dir, busy_batch=8)
    # Default schedule: 8 tokens + 8 lookahead after the prompt; busy: 4 + 4.
    assert {r: off[r] - on[r] for r in off} == {r: 8 for r in off}


def test_a_stream_joined_by_a_burst_before_its_first_chunk_shortens_too(tiny_model_dir) -> None:
    # r0 starts alone (batch 1); 15 join 3 steps later, before its first chunk is due.
    off = first_audio_steps(tiny_model_dir, busy_batch=0, late=3)
    on = first_audio_steps(tiny_model_dir, busy_batch=8, late=3)
    assert on["r0"] < off["r0"]
    assert max(on.values()) == max(off.values()) - 8


def test_below_the_batch_nothing_changes(tiny_model_dir) -> None:
    assert first_audio_steps(tiny_model_dir, busy_batch=STREAMS + 1) == first_audio_steps(
        tiny_model_dir, busy_batch=0
    )
