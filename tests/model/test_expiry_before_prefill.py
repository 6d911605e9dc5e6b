"""A segment's expiry in the engine (`UtteranceRequest.expires_at`): a request waiting for a
slot past its time is dropped with ExpiredError before its prefill, and the others go on; one
whose prefill has begun is never dropped for it. Counted in engine steps on the tiny model, so
nothing depends on the machine's speed."""

from __future__ import annotations

import time

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
from chattts_server.errors import ExpiredError
from chattts_server.model.loader import load_chattts
from engine_run import CPU, torch_runner

TOKENS = 12


def _request(name: str, expires_at: float | None = None) -> UtteranceRequest:
    return UtteranceRequest(
        request_id=name,
        text="in one hundred meters turn left.",
        voice=VoiceSpec(VoiceKind.SEED, seed=1),
        sampling=SamplingParams(seed=1, min_new_tokens=TOKENS, max_new_tokens=TOKENS),
        refine=RefineOptions(enabled=False),
        expires_at=expires_at,
    )


def test_a_request_waiting_past_its_expiry_is_dropped_before_prefill(tiny_model_dir) -> None:
    config = EngineConfig(max_streams=1, max_tokens=256, max_new_tokens=64)
    runner = torch_runner(load_chattts(tiny_model_dir, CPU, torch.float32), config)
    core = EngineCore.from_config(runner, config)
    core.add_request(_request("busy"))  # holds the one slot
    core.step()
    soon = time.monotonic() + 0.05
    core.add_request(_request("late", expires_at=soon))
    core.add_request(_request("running", expires_at=None))
    errors: dict[str, BaseException] = {}
    audio: dict[str, int] = {}
    while time.monotonic() < soon:
        time.sleep(0.01)
    for _ in range(500):
        if not core.has_unfinished_requests:
            break
        for out in core.step():
            if out.error is not None:
                errors[out.request_id] = out.error
            audio[out.request_id] = audio.get(out.request_id, 0) + sum(len(a) for a in out.audio)
    assert isinstance(errors.get("late"), ExpiredError)
    assert audio.get("late", 0) == 0
    assert "busy" not in errors and "running" not in errors
    assert audio["busy"] > 0 and audio["running"] > 0


def test_a_request_whose_prefill_began_is_not_dropped_for_expiry(tiny_model_dir) -> None:
    config = EngineConfig(max_streams=1, max_tokens=256, max_new_tokens=64)
    runner = torch_runner(load_chattts(tiny_model_dir, CPU, torch.float32), config)
    core = EngineCore.from_config(runner, config)
    expires = time.monotonic() + 3600
    request = core.add_request(_request("prompt", expires_at=expires))
    core.step()  # its prefill runs
    assert request.num_prefilled > 0
    request.expires_at = time.monotonic() - 1  # its time passes while it decodes
    finished = False
    for _ in range(500):
        for out in core.step():
            assert out.error is None, out.error
            finished = finished or out.done is not None
        if not core.has_unfinished_requests:
            break
    assert finished
