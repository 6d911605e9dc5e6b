"""Alignment heads in the runner, on the tiny random-weight model: calibration when the GPT is
built finds no head (the server serves the estimate and logs so) and is kept per weights; with a
head set by hand each finished utterance carries its alignment (one text token per audio code,
inside its prompt's text) and the capture does not change what is generated; the prompt's text
tokens map to its text."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from chattts_server.config import EngineConfig
from chattts_server.engine.core import EngineCore
from chattts_server.engine.events import UtteranceDone
from chattts_server.engine.gpt_build import GPTSettings, build_gpt
from chattts_server.engine.heads import Heads
from chattts_server.engine.prompts import PromptBuilder
from chattts_server.engine.runner import ModelRunner
from chattts_server.engine.utterance import SamplingParams, UtteranceRequest, VoiceSpec
from chattts_server.model.loader import load_chattts
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
        word_timing=True,
    )


def _built(model_dir, folder) -> ModelRunner:
    """A runner as the server makes one on a CPU: the GPT built (llama.cpp, or torch where it
    does not load), its alignment heads calibrated or read back from `folder`."""
    config = EngineConfig(max_streams=2, max_tokens=256, max_new_tokens=128)
    modules = load_chattts(model_dir, CPU, torch.float32)
    prompts, heads = PromptBuilder(modules, CPU), Heads.from_embed(modules.embed)
    settings = GPTSettings(gguf_folder=folder)
    gpt = build_gpt(modules, config, settings, CPU, torch.float32, prompts, heads)
    return ModelRunner(modules, config, gpt, CPU, torch.float32, prompts, heads)


def test_the_dev_model_has_no_alignment_head_and_says_so(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="chattts_server.timing.calibration"):
        runner = _built(tiny_model_dir, tmp_path)
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
    runner.gpt.alignment_heads = ()
    plain = run_core(EngineCore.from_config(runner, config), {0: [_request(0), _request(1)]})
    done: dict[str, UtteranceDone] = {}
    runner.gpt.alignment_heads = ((1, 2), (0, 1))
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
        runner.gpt.alignment_heads = ()
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
    """The first build calibrates and stores its answer; the next start with the same weights
    reuses it without decoding the calibration sentence, and a stored head is applied."""
    first = _built(tiny_model_dir, tmp_path)
    [entry] = tmp_path.glob("alignment-*.json")
    assert json.loads(entry.read_text())["result"] == []
    with caplog.at_level(logging.INFO, logger="chattts_server"):
        second = _built(tiny_model_dir, tmp_path)
    assert "word timing: source estimate (measured before" in caplog.text
    assert second.alignment_heads == first.alignment_heads == ()

    stored = json.loads(entry.read_text())
    stored["result"] = [[0, 1]]
    entry.write_text(json.dumps(stored))
    third = _built(tiny_model_dir, tmp_path)
    assert third.alignment_heads == ((0, 1),) and third.info.timing_source == "attention"
