"""Our engine's audio codes equal upstream ChatTTS's on the tiny random-weight model.

Deterministic sampling on both sides: upstream with temperature 1e-6 (its multinomial is then
an argmax) and top_K=1; ours with top_k=1 (greedy). The repetition penalty (1.05) and
min_new_tokens=max_new_tokens are active on both sides. The test drives the EngineCore's step
directly (no engine thread), so the test sees each finished utterance's
codes.
Set CHATTTS_TEST_DEVICE=cuda to run both sides on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_devtools.upstream import upstream_chat
from chattts_server.config import EngineConfig
from chattts_server.engine.core import EngineCore
from chattts_server.engine.runner import ModelRunner
from chattts_server.engine.utterance import (
    RefineOptions,
    SamplingParams,
    UtteranceRequest,
    VoiceKind,
    VoiceSpec,
)
from engine_run import CPU, make_runner, run_core

TEXT = "hello there this is a parity test."
N = 40


@pytest.fixture(scope="module")
def shared_runner(tiny_model_dir) -> tuple[ModelRunner, EngineConfig]:
    """One runner for the module (loading costs seconds); each test uses a fresh EngineCore."""
    return make_runner(tiny_model_dir, max_streams=4)


@pytest.fixture(scope="module")
def upstream(tiny_model_dir):
    return upstream_chat(tiny_model_dir, CPU)


@pytest.fixture(scope="module")
def speaker(upstream) -> str:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        return upstream.speaker.sample_random()


def upstream_codes(chat, text: str, spk: str, n: int) -> np.ndarray:
    from ChatTTS import Chat

    params = Chat.InferCodeParams(
        spk_emb=spk,
        prompt="[speed_5]",
        temperature=1e-6,
        top_K=1,
        top_P=0.7,
        repetition_penalty=1.05,
        max_new_token=n,
        min_new_token=n,
        show_tqdm=False,
        manual_seed=0,
    )
    result = list(chat._infer_code([text], False, chat.device, True, params))[-1]
    return result.ids[0].cpu().numpy()


def parity_request(rid: str, text: str, spk: str, n: int) -> UtteranceRequest:
    return UtteranceRequest(
        request_id=rid,
        text=text,
        voice=VoiceSpec(VoiceKind.EMBEDDING, embedding=spk),
        speed=5,
        sampling=SamplingParams(
            top_k=1, repetition_penalty=1.05, min_new_tokens=n, max_new_tokens=n
        ),
    )


def test_text_is_already_normalized(shared_runner):
    runner, _ = shared_runner
    assert runner.prompts.normalize(TEXT) == TEXT


def test_codes_match_upstream_alone(shared_runner, upstream, speaker):
    expected = upstream_codes(upstream, TEXT, speaker, N)
    assert expected.shape == (N, 4)
    runner, config = shared_runner
    results = run_core(
        EngineCore.from_config(runner, config), {0: [parity_request("p", TEXT, speaker, N)]}
    )
    got = results["p"].codes
    assert got is not None and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_codes_match_upstream_inside_a_batch(shared_runner, upstream, speaker):
    expected = upstream_codes(upstream, TEXT, speaker, N)
    runner, config = shared_runner
    others = [
        UtteranceRequest(
            "a",
            "a much longer sentence that keeps going for quite a while.",
            voice=VoiceSpec(VoiceKind.SEED, seed=3),
            speed=2,
            sampling=SamplingParams(seed=11, min_new_tokens=70, max_new_tokens=70),
        ),
        UtteranceRequest(
            "b",
            "short one.",
            sampling=SamplingParams(seed=12, min_new_tokens=15, max_new_tokens=15),
        ),
        UtteranceRequest(
            "c",
            "another request joins later.",
            voice=VoiceSpec(VoiceKind.SEED, seed=5),
            speed=8,
            sampling=SamplingParams(seed=13, temperature=0.7, min_new_tokens=55, max_new_tokens=55),
        ),
    ]
    # 'a' and 'b' start first (slots 0, 1); ours joins mid-flight (slot 2); 'b' finishes and
    # frees slot 1, which 'c' takes while ours is still generating.
    results = run_core(
        EngineCore.from_config(runner, config),
        {0: others[:2], 5: [parity_request("p", TEXT, speaker, N)], 20: others[2:]},
    )
    for rid, n in (("a", 70), ("b", 15), ("c", 55)):
        assert results[rid].codes is not None and results[rid].codes.shape == (n, 4)
    np.testing.assert_array_equal(results["p"].codes, expected)


def test_refine_text_request_completes_with_audio(shared_runner):
    runner, config = shared_runner
    request = UtteranceRequest(
        "r",
        "refine this sentence please.",
        refine=RefineOptions(enabled=True),
        sampling=SamplingParams(seed=1, min_new_tokens=20, max_new_tokens=20),
    )
    res = run_core(EngineCore.from_config(runner, config), {0: [request]})["r"]
    assert res.finish_reason == "max_tokens"
    assert res.codes is not None and res.codes.shape == (20, 4)
    assert res.text
    audio = np.concatenate(res.audio)
    assert audio.size > 0 and np.isfinite(audio).all()
