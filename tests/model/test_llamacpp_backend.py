"""The GPT on llama.cpp (`--backend llamacpp`, engine/llamacpp_gpt.py) against our torch forward,
on the tiny random-weight model in the official layout.

- F32 GGUF: greedy audio codes equal torch fp32's, one stream and eight joining at different
  steps (each slot a llama.cpp sequence).
- Every format's hidden states against torch fp32 as an SNR; the formats `auto` would serve clear
  the budget.
- A finished or cancelled stream's sequence is removed; prompts of one step share one
  `llama_decode`.
- The GGUF files are cached by weights and format; the choice at warm-up logs its figures.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from chattts_server.config import EngineConfig
from chattts_server.defaults import GGUF_FORMATS, MIN_SNR_DB
from chattts_server.engine.backend_choice import llamacpp_unavailable
from chattts_server.engine.core import EngineCore
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT
from chattts_server.engine.runner import BackendSettings, ModelRunner
from chattts_server.engine.utterance import SamplingParams, UtteranceRequest, VoiceKind, VoiceSpec
from chattts_server.model.autotune import snr_db
from chattts_server.model.loader import load_chattts
from engine_run import CPU, run_core

pytestmark = pytest.mark.skipif(
    llamacpp_unavailable() is not None, reason=str(llamacpp_unavailable())
)
TEXTS = ["the first one.", "a second, longer sentence with more words.", "third.", "four is here."]


def _runner(
    model_dir: Path, folder: Path, backend: str, fmt: str = "F32", warm: bool = True
) -> ModelRunner:
    config = EngineConfig(max_streams=8, max_tokens=256, max_new_tokens=64)
    settings = BackendSettings(backend, fmt, folder)
    runner = ModelRunner(
        load_chattts(model_dir, CPU, torch.float32), config, CPU, torch.float32, backend=settings
    )
    if warm:
        runner.warmup(8)
    return runner


def _greedy(i: int, n: int) -> UtteranceRequest:
    return UtteranceRequest(
        request_id=f"r{i}",
        text=TEXTS[i % len(TEXTS)],
        voice=VoiceSpec(VoiceKind.SEED, seed=i),
        sampling=SamplingParams(top_k=1, min_new_tokens=n, max_new_tokens=n),
    )


def _codes(runner: ModelRunner, joins: dict[int, list[UtteranceRequest]]) -> dict[str, np.ndarray]:
    core = EngineCore.from_config(runner, runner.config)
    return {rid: r.codes for rid, r in run_core(core, joins).items()}  # type: ignore[misc]


@pytest.fixture(scope="module")
def runners(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("gguf")
    return _runner(tiny_model_dir, folder, "torch"), _runner(tiny_model_dir, folder, "llamacpp")


def test_f32_greedy_codes_equal_torch_fp32(runners) -> None:
    torch_runner, llama_runner = runners
    assert llama_runner.gpt.name == "llamacpp F32" and llama_runner.info.backend == "llamacpp F32"
    joins = {0: [_greedy(0, 24)], 3: [_greedy(i, 12 + 4 * i) for i in range(1, 8)]}
    ours, theirs = _codes(llama_runner, joins), _codes(torch_runner, joins)
    assert set(ours) == set(theirs) == {f"r{i}" for i in range(8)}
    for rid in ours:
        np.testing.assert_array_equal(ours[rid], theirs[rid], err_msg=rid)


def test_every_format_is_held_against_torch_and_auto_serves_one_within_budget(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cold = _runner(tiny_model_dir, tmp_path, "llamacpp", warm=False)  # weights not dropped yet
    gpt = cold.gpt
    probe = torch.randn(24, gpt.shape.hidden_size, generator=torch.Generator().manual_seed(0))
    reference = gpt.llama.prefill(0, probe, 0, gpt.cache)  # type: ignore[attr-defined]
    snr = {}
    for fmt in GGUF_FORMATS:
        candidate = cold.build_llamacpp(fmt)
        try:
            snr[fmt] = snr_db(reference, candidate.hidden_states(1, probe))
        finally:
            candidate.close()
    print("hidden-state SNR vs torch fp32 on the tiny model:", snr)
    assert snr["F32"] > 80 and snr["F16"] > 50  # exact but for summation order; half weights
    with caplog.at_level(logging.INFO, logger="chattts_server.engine.backend_choice"):
        auto = _runner(tiny_model_dir, tmp_path, "auto", "auto")
    line = next(r.message for r in caplog.records if r.message.startswith("GPT backend:"))
    served = auto.gpt.name
    assert served == "torch" or snr[served.split()[1]] >= MIN_SNR_DB, line
    assert "torch" in line and "F16" in line  # every candidate's step time is in the log


def test_a_finished_or_cancelled_stream_leaves_no_sequence(runners) -> None:
    _, runner = runners
    gpt = runner.gpt
    assert isinstance(gpt, LlamaCppGPT)
    lc, memory = gpt._lc, gpt._memory
    core = EngineCore.from_config(runner, runner.config)
    core.add_request(_greedy(0, 12))
    core.add_request(_greedy(1, 40))
    for _ in range(6):
        core.step()
    assert (
        lc.llama_memory_seq_pos_max(memory, 0) >= 0 and lc.llama_memory_seq_pos_max(memory, 1) >= 0
    )
    core.abort_request("r1")
    while core.has_unfinished_requests:
        core.step()
    core.step()  # the plan after the last flush and release
    for slot in range(runner.config.max_streams):
        assert lc.llama_memory_seq_pos_max(memory, slot) == -1, slot


def test_prompts_of_one_step_share_one_decode_call(runners, monkeypatch) -> None:
    _, runner = runners
    gpt = runner.gpt
    calls = []
    real = gpt._decode
    monkeypatch.setattr(gpt, "_decode", lambda *a: calls.append(a) or real(*a))
    core = EngineCore.from_config(runner, runner.config)
    for i in range(4):
        core.add_request(_greedy(i, 8))
    core.step()
    assert len(calls) == 1 and len(calls[0][1]) == 4  # four prompts, one call, four states
    while core.has_unfinished_requests:
        core.step()


def test_gguf_files_are_reused_per_weights_and_format(runners) -> None:
    _, runner = runners
    from chattts_server.model.gguf_export import GGUFCache

    cache = GGUFCache(runner.backend.gguf_folder, runner.weights_digest)
    path = cache.path("F32")
    assert path.exists() and runner.weights_digest[:24] in path.name
    before = path.stat().st_mtime_ns
    runner.build_llamacpp("F32").close()
    assert path.stat().st_mtime_ns == before
