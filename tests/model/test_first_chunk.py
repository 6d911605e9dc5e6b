"""The first chunk's size and lookahead set when a stream's first audio comes, alone or at a
full batch: counted in engine steps on the tiny model, so the check does not depend on the
machine's speed (bench/bench_serving.py --parts first-audio measures the milliseconds)."""

from __future__ import annotations

import torch

from chattts_server.config import EngineConfig
from chattts_server.engine.core import EngineCore
from chattts_server.engine.utterance import (
    ChunkingOptions,
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


def first_audio_steps(
    model_dir, streams: int = STREAMS, chunking: ChunkingOptions | None = None, **flags: int
) -> dict[str, int]:
    """`streams` requests at step 0; the engine step at which each one's first audio came."""
    config = EngineConfig(max_streams=STREAMS, max_tokens=256, max_new_tokens=64, **flags)
    runner = torch_runner(load_chattts(model_dir, CPU, torch.float32), config)
    core = EngineCore.from_config(runner, config)
    requests = [
        UtteranceRequest(
            request_id=f"r{i}",
            text=f"stream number {i} says a few words.",
            voice=VoiceSpec(VoiceKind.SEED, seed=i),
            sampling=SamplingParams(seed=i, min_new_tokens=TOKENS, max_new_tokens=TOKENS),
            refine=RefineOptions(enabled=False),
            chunking=chunking or ChunkingOptions(),
        )
        for i in range(streams)
    ]
    joins = {0: requests}
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
    assert len(first) == streams
    return first


def test_first_audio_comes_after_the_prompt_and_seven_steps_alone_or_at_a_full_batch(
    tiny_model_dir,
) -> None:
    # The prompt's step samples the first token; the 4-token first chunk needs 4 more past it
    # (--first-lookahead-tokens), so the 8th step (index 7) decodes it, at any batch.
    assert first_audio_steps(tiny_model_dir, streams=1) == {"r0": 7}
    # Sixteen prompts take two steps of the prefill budget (--prefill-chunk-tokens 256).
    assert set(first_audio_steps(tiny_model_dir).values()) == {7, 8}


def test_the_flags_and_a_request_set_the_first_chunk(tiny_model_dir) -> None:
    # 8 + 8, as the server's flags before issue 47: eight steps later.
    slower = first_audio_steps(
        tiny_model_dir, streams=2, first_chunk_tokens=8, first_lookahead_tokens=8
    )
    assert set(slower.values()) == {15}
    # A request's own lookahead holds for its first chunk too.
    own = first_audio_steps(tiny_model_dir, streams=2, chunking=ChunkingOptions(None, None, 6))
    assert set(own.values()) == {4 + 6 - 1}
