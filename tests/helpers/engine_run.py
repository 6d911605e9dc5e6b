"""Drive an `EngineCore` directly, without the engine thread: submit requests at given steps and
collect each one's audio, codes and ending (parity, concurrency, CUDA and profile tests)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from chattts_server.config import EngineConfig
from chattts_server.engine.core import EngineCore
from chattts_server.engine.gpt import TorchGPT
from chattts_server.engine.gpt_build import capture_graphs
from chattts_server.engine.runner import ModelRunner
from chattts_server.engine.utterance import UtteranceRequest
from chattts_server.model.loader import ChatTTSModules, load_chattts

CPU = torch.device(os.environ.get("CHATTTS_TEST_DEVICE", "cpu"))
"""Where runner and upstream run; bench/gpu_check.sh sets CHATTTS_TEST_DEVICE=cuda (fp32 both)."""


@dataclass
class Result:
    codes: np.ndarray | None = None
    audio: list[np.ndarray] = field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""


def run_core(
    core: EngineCore,
    joins: dict[int, list[UtteranceRequest]],
    max_steps: int = 5000,
) -> dict[str, Result]:
    """Step `core` until idle; `joins[k]` are submitted before step k. Each request's audio,
    codes and ending, by request id."""
    joins = dict(joins)
    results: dict[str, Result] = {}
    for step in range(max_steps):
        if not (core.has_unfinished_requests or joins):
            break
        for request in joins.pop(step, []):
            core.add_request(request)
            results[request.request_id] = Result()
        for out in core.step():
            res = results[out.request_id]
            res.audio.extend(out.audio)
            assert out.error is None, out.error
            if out.done is not None:
                res.codes, res.finish_reason, res.text = (
                    out.codes,
                    out.done.finish_reason,
                    out.done.text,
                )
    assert not core.has_unfinished_requests, "did not finish"
    return results


def torch_runner(
    modules: ChatTTSModules,
    config: EngineConfig,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    decode_graphs: str = "off",
) -> ModelRunner:
    """A runner over our torch forward (the GPU path; the CPU fallback in fp32): what the
    parity tests hold against upstream ChatTTS, and the CUDA graph tests run."""
    gpt = capture_graphs(TorchGPT.build(modules, config, device, dtype, decode_graphs))
    return ModelRunner(modules, config, gpt, device, dtype)


def make_runner(
    model_dir, max_streams: int = 8, max_tokens: int = 512
) -> tuple[ModelRunner, EngineConfig]:
    config = EngineConfig(max_streams=max_streams, max_tokens=max_tokens, max_new_tokens=384)
    return torch_runner(load_chattts(model_dir, CPU, torch.float32), config), config
