"""The GPT on llama.cpp (engine/llamacpp_gpt.py, built by engine/gpt_build.py) against our torch
forward, on the tiny random-weight model in the official layout.

- F32 GGUF: greedy audio codes equal torch fp32's, one stream and eight joining at different
  steps (each slot a llama.cpp sequence), and rows of scattered slots in any order.
- `--gguf-format auto`: the smallest format within the quality budget of torch fp32, measured
  once per weights and read back on the next start; only the served file stays in the folder.
- Word timing: the attention the eval callback reads equals torch's capture on the same codes.
- A finished or cancelled stream's sequence is removed; prompts of one step share one
  `llama_decode`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from chattts_server.config import EngineConfig
from chattts_server.defaults import GGUF_FORMATS, MIN_SNR_DB
from chattts_server.engine.core import EngineCore
from chattts_server.engine.events import UtteranceDone
from chattts_server.engine.gpt_build import GPTSettings, build_gpt, fp32_reference
from chattts_server.engine.heads import Heads
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT, llamacpp_unavailable
from chattts_server.engine.prompts import PromptBuilder
from chattts_server.engine.runner import ModelRunner
from chattts_server.engine.utterance import SamplingParams, UtteranceRequest, VoiceKind, VoiceSpec
from chattts_server.model.gguf_export import GGUFCache
from chattts_server.model.llama import DecodeBatch, PromptRun
from chattts_server.model.llama_layers import LlamaShape
from chattts_server.model.loader import load_chattts
from chattts_server.model.warmup_cache import snr_db, weights_digest
from engine_run import CPU, run_core, torch_runner

pytestmark = pytest.mark.skipif(
    llamacpp_unavailable() is not None, reason=str(llamacpp_unavailable())
)
TEXTS = ["the first one.", "a second, longer sentence with more words.", "third.", "four is here."]
CONFIG = EngineConfig(max_streams=8, max_tokens=256, max_new_tokens=64)


def _runner(model_dir: Path, folder: Path, weight_format: str) -> ModelRunner:
    """A runner as the server makes one on a CPU (`ModelRunner.load`)."""
    modules = load_chattts(model_dir, CPU, torch.float32)
    prompts, heads = PromptBuilder(modules, CPU), Heads.from_embed(modules.embed)
    settings = GPTSettings(gguf_format=weight_format, gguf_folder=folder)
    gpt = build_gpt(modules, CONFIG, settings, CPU, torch.float32, prompts, heads)
    runner = ModelRunner(modules, CONFIG, gpt, CPU, torch.float32, prompts, heads)
    runner.warmup(CONFIG.max_streams)
    return runner


def _greedy(i: int, n: int, word_timing: bool = False) -> UtteranceRequest:
    return UtteranceRequest(
        request_id=f"r{i}",
        text=TEXTS[i % len(TEXTS)],
        voice=VoiceSpec(VoiceKind.SEED, seed=i),
        sampling=SamplingParams(top_k=1, min_new_tokens=n, max_new_tokens=n),
        word_timing=word_timing,
    )


def _run(runner: ModelRunner, joins: dict[int, list[UtteranceRequest]]) -> dict[str, object]:
    return run_core(EngineCore.from_config(runner, runner.config), joins)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def runners(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("gguf")
    torch_fp32 = torch_runner(load_chattts(tiny_model_dir, CPU, torch.float32), CONFIG)
    return torch_fp32, _runner(tiny_model_dir, folder, "F32")


def test_f32_greedy_codes_equal_torch_fp32(runners) -> None:
    torch_runner_, llama_runner = runners
    assert llama_runner.gpt.name == "llamacpp F32" and llama_runner.info.backend == "llamacpp F32"
    joins = {0: [_greedy(0, 24)], 3: [_greedy(i, 12 + 4 * i) for i in range(1, 8)]}
    ours, theirs = _run(llama_runner, joins), _run(torch_runner_, joins)
    assert set(ours) == set(theirs) == {f"r{i}" for i in range(8)}
    for rid in ours:
        np.testing.assert_array_equal(ours[rid].codes, theirs[rid].codes, err_msg=rid)  # type: ignore[attr-defined]


def test_rows_of_scattered_slots_in_any_order_get_their_own_states(runners) -> None:
    """llama.cpp batches consecutive sequences together: rows are sorted for it and the hidden
    states come back in the order given, each the same as its slot alone."""
    _, runner = runners
    gpt = runner.gpt
    d = gpt.shape.hidden_size
    generator = torch.Generator().manual_seed(1)
    prompts = {slot: torch.randn(6, d, generator=generator) for slot in (5, 0, 2)}
    steps = torch.randn(3, d, generator=generator)
    alone = []
    for i, (slot, prompt) in enumerate(prompts.items()):
        gpt.free_slot(slot)
        gpt.forward([PromptRun(slot, prompt, 0)], None)
        _, hidden, _ = gpt.forward(
            [], DecodeBatch(torch.tensor([slot]), steps[i : i + 1], torch.tensor([6]))
        )
        alone.append(hidden[0])
        gpt.free_slot(slot)
    prompt_last, _, _ = gpt.forward([PromptRun(s, p, 0) for s, p in prompts.items()], None)
    assert len(prompt_last) == 3
    _, together, _ = gpt.forward(
        [], DecodeBatch(torch.tensor(list(prompts)), steps, torch.tensor([6, 6, 6]))
    )
    for slot in prompts:
        gpt.free_slot(slot)
    for i in range(3):
        torch.testing.assert_close(together[i], alone[i], atol=1e-4, rtol=1e-4)


def test_auto_serves_the_smallest_format_within_budget_and_keeps_the_answer(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    modules = load_chattts(tiny_model_dir, CPU, torch.float32)
    prompts = PromptBuilder(modules, CPU)
    probe = prompts.code_prompt(prompts.normalize("Turn left, then right."), VoiceSpec(), 5)
    reference = fp32_reference(modules, probe.embeds)
    shape = LlamaShape.from_config(modules.gpt_config)
    files = GGUFCache(tmp_path / "all", weights_digest(modules.gpt_state_dict))
    snr = {}
    for fmt in GGUF_FORMATS:
        path = files.get(fmt, modules.gpt_state_dict, shape, 10000.0, 2)
        gpt = LlamaCppGPT(path, shape, 1, 64, 64, 2, fmt)
        try:
            snr[fmt] = snr_db(reference, gpt.hidden_states(0, probe.embeds))
        finally:
            gpt.close()
    print("hidden-state SNR vs torch fp32 on the tiny model:", snr)
    assert snr["F32"] > 80 and snr["F16"] > 50  # exact but for summation order; half weights
    smallest = next(f for f in reversed(GGUF_FORMATS) if snr[f] >= MIN_SNR_DB)

    folder = tmp_path / "served"
    with caplog.at_level(logging.INFO, logger="chattts_server.engine.gpt_build"):
        first = _runner(tiny_model_dir, folder, "auto")
    assert first.info.backend == f"llamacpp {smallest}"
    assert f"GGUF format {smallest}: the smallest within {MIN_SNR_DB:g} dB of fp32" in caplog.text
    assert [p.name.split("-v1-")[1] for p in folder.glob("*.gguf")] == [f"{smallest}.gguf"]
    assert not list(folder.glob(".candidates-*")), "the candidates' folder is removed"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chattts_server.engine.gpt_build"):
        second = _runner(tiny_model_dir, folder, "auto")
    assert second.info.backend == f"llamacpp {smallest}"
    assert f"GGUF format {smallest} (the smallest within" in caplog.text
    assert "measured before" in caplog.text


def test_word_timing_reads_the_same_attention_as_torch(runners) -> None:
    """With alignment heads, the F32 context's eval callback reads `kq_soft_max` of the heads'
    layers: the same weights over the text, and the same path, as torch's capture."""
    torch_runner_, llama_runner = runners
    heads = ((1, 2), (0, 1), (1, 0))
    gpt = llama_runner.gpt
    assert isinstance(gpt, LlamaCppGPT)
    gpt.set_attention_tap(True)
    found: dict[str, dict[str, UtteranceDone]] = {}
    try:
        for name, runner in (("torch", torch_runner_), ("llamacpp", llama_runner)):
            runner.gpt.alignment_heads = heads
            core = EngineCore.from_config(runner, runner.config)
            for i in (0, 2, 3):  # slots 0-2, then 1 frees: a gap in the decode batch
                core.add_request(_greedy(i, 10 + 6 * i, word_timing=i != 2))
            found[name] = {}
            while core.has_unfinished_requests:
                for out in core.step():
                    if out.done is not None:
                        found[name][out.request_id] = out.done
    finally:
        torch_runner_.gpt.alignment_heads = llama_runner.gpt.alignment_heads = ()
        gpt.set_attention_tap(False)
    for rid, theirs in found["torch"].items():
        ours = found["llamacpp"][rid]
        if rid == "r2":  # its stream did not ask: its attention is not read
            assert ours.alignment is None and theirs.alignment is None
            continue
        assert ours.alignment is not None and theirs.alignment is not None
        assert ours.alignment.path == theirs.alignment.path, rid
        assert len(ours.alignment.path) == 10 + 6 * int(rid[1:])


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


def test_gguf_files_are_reused_per_weights_and_format(runners, tiny_model_dir: Path) -> None:
    _, runner = runners
    [path] = [p for p in runner.gpt.gguf_path.parent.glob("*-F32.gguf")]
    digest = weights_digest(load_chattts(tiny_model_dir, CPU, torch.float32).gpt_state_dict)
    assert digest[:24] in path.name
    before = path.stat().st_mtime_ns
    _runner(tiny_model_dir, path.parent, "F32")
    assert path.stat().st_mtime_ns == before
