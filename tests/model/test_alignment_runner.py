"""Alignment heads in the runner, on the tiny random-weight model: calibration at warm-up finds no
head (the server serves the estimate and logs so); with a head set by hand each finished
utterance carries its alignment (one text token per audio code, inside its prompt's text) and
the capture does not change what is generated; the prompt's text tokens map to its text."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from chattts_server.config import EngineConfig
from chattts_server.engine.core import EngineCore
from chattts_server.engine.events import UtteranceDone
from chattts_server.engine.runner import ModelRunner
from chattts_server.engine.utterance import SamplingParams, UtteranceRequest, VoiceSpec
from engine_run import CPU, make_runner, run_core

TEXT = "turn left in two hundred meters, then stop."


@pytest.fixture(scope="module")
def runner_and_config(tiny_model_dir):
    return make_runner(tiny_model_dir, max_streams=2, max_tokens=256)


def _request(i: int) -> UtteranceRequest:
    return UtteranceRequest(
        request_id=f"r{i}",
        text=TEXT,
        voice=VoiceSpec(),
        sampling=SamplingParams(seed=7 + i, min_new_tokens=20, max_new_tokens=20),
    )


def test_the_dev_model_has_no_alignment_head_and_says_so(runner_and_config, caplog) -> None:
    runner, _ = runner_and_config
    with caplog.at_level(logging.INFO, logger="chattts_server.engine.alignment"):
        runner.warmup(2)
    assert runner.alignment_heads == ()
    assert runner.info.timing_source == "estimate"
    assert "word timing: source estimate, no attention head aligns" in caplog.text


def test_prompt_text_tokens_cover_the_text(runner_and_config) -> None:
    runner, _ = runner_and_config
    text = runner.prompts.normalize(TEXT)
    prompt = runner.prompts.code_prompt(text, VoiceSpec(), 5)
    tokens = prompt.text_tokens
    assert tokens is not None
    start, end = tokens.positions
    assert 0 < start < end < prompt.embeds.shape[0]
    spelled = "".join(text[a:b] for a, b in tokens.token_chars)
    assert spelled == "".join(text.split())  # every character but the spaces, in order


def test_a_chosen_head_gives_each_utterance_its_alignment(runner_and_config) -> None:
    runner, config = runner_and_config
    runner.alignment_heads = ()
    plain = run_core(EngineCore.from_config(runner, config), {0: [_request(0), _request(1)]})
    done: dict[str, UtteranceDone] = {}
    runner.alignment_heads = ((1, 2), (0, 1))
    try:
        core = EngineCore.from_config(runner, config)
        for r in (_request(0), _request(1)):
            core.add_request(r)
        codes: dict[str, np.ndarray] = {}
        while core.has_unfinished_requests:
            for out in core.step():
                if out.done is not None:
                    done[out.request_id], codes[out.request_id] = out.done, out.codes
    finally:
        runner.alignment_heads = ()
    prompt = runner.prompts.code_prompt(runner.prompts.normalize(TEXT), VoiceSpec(), 5)
    assert prompt.text_tokens is not None
    num_text_tokens = len(prompt.text_tokens.token_chars)
    for rid in ("r0", "r1"):
        np.testing.assert_array_equal(codes[rid], plain[rid].codes)
        alignment = done[rid].alignment
        assert alignment is not None
        assert len(alignment.path) == len(codes[rid]) == 20
        assert all(0 <= t < num_text_tokens for t in alignment.path)
        assert len(alignment.token_chars) == num_text_tokens


def test_the_chosen_heads_are_kept_in_the_warmup_cache(tiny_model_dir, tmp_path, caplog) -> None:
    """The first warm-up calibrates and stores its answer; the next start with the same weights
    reuses it without decoding the calibration sentence, and a stored head is applied."""
    from chattts_server.model.autotune_cache import AutotuneCache
    from chattts_server.model.loader import load_chattts

    config = EngineConfig(max_streams=2, max_tokens=256, max_new_tokens=128)

    def start() -> ModelRunner:
        modules = load_chattts(tiny_model_dir, CPU, torch.float32)
        runner = ModelRunner(modules, config, CPU, torch.float32, autotune_cache=cache)
        runner.warmup(2)
        return runner

    cache = AutotuneCache(tmp_path)
    first = start()
    [entry] = tmp_path.glob("alignment-*.json")
    assert json.loads(entry.read_text())["result"] == []
    with caplog.at_level(logging.INFO, logger="chattts_server"):
        second = start()
    assert "word timing: source estimate (reused" in caplog.text
    assert second.alignment_heads == first.alignment_heads == ()

    stored = json.loads(entry.read_text())
    stored["result"] = [[0, 1]]
    entry.write_text(json.dumps(stored))
    assert start().alignment_heads == ((0, 1),)
