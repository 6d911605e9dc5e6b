"""Batched per-row sampling against ChatTTS's processors and transformers' warpers."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers.generation import TopKLogitsWarper, TopPLogitsWarper

from chattts_server.engine.sampling import (
    SamplingBatch,
    TokenHistory,
    apply_repetition_penalty,
    filter_sorted,
    make_generator,
    sample,
)
from chattts_server.engine.utterance import SamplingParams

NUM_VQ, VOCAB, EOS = 4, 626, 625  # ChatTTS audio head


def _chattts_processors() -> ModuleType:
    # Load ChatTTS/model/processors.py alone: importing the ChatTTS package pulls in torchaudio
    # and the whole pipeline, which this test does not need.
    package = importlib.util.find_spec("ChatTTS")
    assert package is not None and package.submodule_search_locations
    path = Path(package.submodule_search_locations[0]) / "model" / "processors.py"
    spec = importlib.util.spec_from_file_location("chattts_processors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batch(params: list[SamplingParams], num_vq: int = NUM_VQ, vocab: int = VOCAB):
    gens = [make_generator(p.seed) for p in params]
    return SamplingBatch.build(params, gens, num_vq, vocab, EOS if vocab == VOCAB else None, "cpu")


def _history_after(tokens: torch.Tensor) -> TokenHistory:
    """A TokenHistory whose slot i has had tokens[i] (steps, Q) appended step by step."""
    num_rows, steps, num_vq = tokens.shape
    history = TokenHistory(num_slots=num_rows + 2, num_vq=num_vq, device="cpu")
    slots = torch.arange(num_rows)
    for t in range(steps):
        history.append(slots, tokens[:, t], torch.full((num_rows,), t))
    return history


def test_repetition_penalty_matches_chattts_processor() -> None:
    processors = _chattts_processors()
    torch.manual_seed(0)
    # Row 0 has generated 25 tokens (window full, wrapped), row 1 only 5 (window partly empty).
    generated = [torch.randint(0, 40, (25, NUM_VQ)), torch.randint(0, 40, (5, NUM_VQ))]
    penalties = [1.3, 1.05]
    logits = torch.randn(2, NUM_VQ, VOCAB) * 3
    for row, (tokens, penalty) in enumerate(zip(generated, penalties, strict=True)):
        history = _history_after(tokens[None])
        window = history.gather(torch.tensor([0]))
        ours = apply_repetition_penalty(logits[row : row + 1], window, torch.tensor(penalty))
        # ChatTTS: rows are (batch, codebook), input_ids the generated tokens per codebook.
        proc = processors.CustomRepetitionPenaltyLogitsProcessorRepeat(penalty, EOS, 16)
        expected = proc(tokens.T.contiguous(), logits[row].clone())
        torch.testing.assert_close(ours[0], expected)
        assert not torch.equal(ours[0], logits[row])


def test_top_k_one_is_argmax_of_penalised_logits() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, NUM_VQ, VOCAB)
    tokens = torch.randint(0, VOCAB - 1, (3, 20, NUM_VQ))
    # Make the recent tokens the favourites so the penalty changes the argmax.
    logits.scatter_(2, tokens[:, -4:].transpose(1, 2), 4.0)
    history = _history_after(tokens)
    window, counts = history.gather(torch.arange(3)), torch.full((3,), 20)
    params = [
        SamplingParams(top_k=1, repetition_penalty=3.0, temperature=0.7, seed=s) for s in (1, 2, 3)
    ]
    got = sample(logits, _batch(params), window, counts)
    penalised = apply_repetition_penalty(logits / 0.7, window, torch.tensor(3.0))
    torch.testing.assert_close(got, penalised.argmax(-1), rtol=0, atol=0)
    assert not torch.equal(got, logits.argmax(-1))


def test_top_p_top_k_match_transformers_warpers() -> None:
    torch.manual_seed(2)
    cases = [(0.7, 20), (0.9, 3), (0.3, 50), (1.0, 5), (0.5, 0), (0.95, 2)]
    params = [SamplingParams(top_p=p, top_k=k) for p, k in cases]
    logits = torch.randn(len(cases), NUM_VQ, VOCAB) * 2
    batch = _batch(params)
    sorted_logits, sorted_ids = filter_sorted(logits.view(-1, VOCAB), batch)
    ours = torch.empty_like(sorted_logits).scatter_(1, sorted_ids, sorted_logits)
    ours = ours.view(len(cases), NUM_VQ, VOCAB)
    for row, (p, k) in enumerate(cases):
        expected = TopPLogitsWarper(p, min_tokens_to_keep=3)(None, logits[row])
        if k:
            expected = TopKLogitsWarper(k, min_tokens_to_keep=3)(None, expected)
        assert torch.equal(torch.isinf(ours[row]), torch.isinf(expected)), (p, k)
        torch.testing.assert_close(ours[row], expected)
        assert torch.isfinite(ours[row]).sum(-1).min() >= 3


def test_seeded_row_draws_the_same_whatever_its_companions() -> None:
    torch.manual_seed(3)
    steps = [torch.randn(1, NUM_VQ, VOCAB) for _ in range(6)]
    mine = SamplingParams(seed=1234, top_p=0.9, top_k=50, temperature=1.0)

    def run(
        companions: list[SamplingParams], row: int, mine: SamplingParams = mine
    ) -> list[torch.Tensor]:
        params = companions[:row] + [mine] + companions[row:]
        batch = _batch(params)
        shared = torch.Generator().manual_seed(99)
        out = []
        for i, mine_logits in enumerate(steps):
            others = torch.randn(len(params), NUM_VQ, VOCAB)
            logits = torch.cat([others[:row], mine_logits, others[row + 1 :]])
            counts = torch.full((len(params),), i)
            out.append(sample(logits, batch, None, counts, shared)[row])
        return out

    alone = run([], 0)
    crowded = run([SamplingParams(), SamplingParams(seed=7), SamplingParams(top_k=1)], 2)
    for a, b in zip(alone, crowded, strict=True):
        assert torch.equal(a, b)
    other_seed = run([], 0)
    reseeded = run([], 0, replace(mine, seed=4321))
    assert any(not torch.equal(a, b) for a, b in zip(other_seed, reseeded, strict=True))


def test_min_new_tokens_masks_eos_until_reached() -> None:
    logits = torch.zeros(2, NUM_VQ, VOCAB)
    logits[..., EOS] = 30.0  # EOS would win every draw
    params = [SamplingParams(min_new_tokens=4), SamplingParams(min_new_tokens=4, top_k=1)]
    batch = _batch(params)
    shared = torch.Generator().manual_seed(0)
    for step in range(4):
        for _ in range(20):
            tokens = sample(logits, batch, None, torch.tensor([step, step]), shared)
            assert not (tokens == EOS).any(), step
    tokens = sample(logits, batch, None, torch.tensor([4, 3]), shared)
    assert (tokens[0] == EOS).all() and not (tokens[1] == EOS).any()


def test_temperature_per_codebook_per_row() -> None:
    vocab, rows_per_group = 6, 3000
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5, -1.0, 1.5]).expand(2 * rows_per_group, 2, vocab)
    temps = [(0.5, 2.0), (1.0, 0.25)]
    params = [
        SamplingParams(temperature=temps[i % 2], top_p=1.0, top_k=0, repetition_penalty=1.0)
        for i in range(2 * rows_per_group)
    ]
    batch = _batch(params, num_vq=2, vocab=vocab)
    shared = torch.Generator().manual_seed(5)
    tokens = sample(
        logits.contiguous(), batch, None, torch.zeros(len(params), dtype=torch.long), shared
    )
    for group, group_temps in enumerate(temps):
        for code, temp in enumerate(group_temps):
            drawn = tokens[group::2, code]
            freq = torch.bincount(drawn, minlength=vocab).float() / rows_per_group
            expected = torch.softmax(logits[0, 0] / temp, -1)
            torch.testing.assert_close(freq, expected, atol=0.035, rtol=0)


def test_text_head_shape_and_greedy() -> None:
    logits = torch.randn(3, 1, 50)
    params = [SamplingParams(top_k=1), SamplingParams(seed=1), SamplingParams()]
    batch = SamplingBatch.build(
        params, [make_generator(p.seed) for p in params], 1, 50, None, "cpu"
    )
    tokens = sample(logits, batch, None, torch.zeros(3, dtype=torch.long))
    assert tokens.shape == (3, 1)
    assert tokens[0, 0] == logits[0, 0].argmax()


def test_token_history_reset_and_window() -> None:
    history = TokenHistory(num_slots=3, num_vq=2, device="cpu", window=4)
    slots = torch.tensor([2, 0])
    for t in range(6):
        history.append(slots, torch.tensor([[t, 10 + t], [20 + t, 30 + t]]), torch.full((2,), t))
    window = history.gather(torch.tensor([2, 1]))
    assert sorted(window[0, 0].tolist()) == [2, 3, 4, 5]
    assert (window[1] == -1).all()
    history.reset(2)
    assert (history.gather(torch.tensor([2])) == -1).all()


@pytest.mark.parametrize("bad", [(1.0, 2.0, 3.0)])
def test_temperature_must_match_codebooks(bad) -> None:
    with pytest.raises(ValueError):
        _batch([SamplingParams(temperature=bad)])
