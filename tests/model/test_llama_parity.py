"""Our slot-cache Llama forward against transformers' LlamaModel on the same random weights.

Tolerance: 1e-4 absolute/relative in fp32 (observed differences are around 1e-7). This is the
forward of the GPU path and of a CPU where llama.cpp did not build; llama.cpp is held against it
in test_llamacpp_backend.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.model.kv_cache import SlotKVCache
from chattts_server.model.llama import DecodeBatch, LlamaDecoder, LlamaShape, PromptRun

HIDDEN = 128
ATOL = RTOL = 1e-4


def _models(num_kv_heads: int) -> tuple[LlamaModel, LlamaDecoder, LlamaShape]:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        num_hidden_layers=2,
        max_position_embeddings=128,
        vocab_size=8,
    )
    ref = LlamaModel(config).eval()
    # Larger than the default init so attention is far from uniform and errors would show.
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    ours = LlamaDecoder.from_state_dict(config, ref.state_dict(), "cpu", torch.float32)
    return ref, ours, LlamaShape.from_config(config)


@pytest.fixture(params=[4, 2], ids=["mha", "gqa"])
def models(request: pytest.FixtureRequest) -> tuple[LlamaModel, LlamaDecoder, LlamaShape]:
    return _models(request.param)


def _reference_last(ref: LlamaModel, seq: torch.Tensor) -> torch.Tensor:
    return ref(inputs_embeds=seq[None]).last_hidden_state[0, -1]


@torch.inference_mode()
def test_prefill_matches_llama_model(models) -> None:
    ref, ours, shape = models
    cache = SlotKVCache(shape, num_slots=3, max_tokens=64, device="cpu", dtype=torch.float32)
    prompt = torch.randn(20, HIDDEN)
    expected = ref(inputs_embeds=prompt[None]).last_hidden_state[0]
    torch.testing.assert_close(ours.prefill(1, prompt, 0, cache), expected, atol=ATOL, rtol=RTOL)


@torch.inference_mode()
def test_chunked_prefill_matches_single_prefill(models) -> None:
    _, ours, shape = models
    cache = SlotKVCache(shape, num_slots=2, max_tokens=64, device="cpu", dtype=torch.float32)
    prompt = torch.randn(21, HIDDEN)
    whole = ours.prefill(0, prompt, 0, cache)
    chunked = torch.cat(
        [ours.prefill(1, prompt[:8], 0, cache), ours.prefill(1, prompt[8:], 8, cache)]
    )
    torch.testing.assert_close(chunked, whole, atol=ATOL, rtol=RTOL)
    # Both slots now hold the same K/V for the prompt.
    torch.testing.assert_close(
        cache.kv[:, :, 1, :, :21], cache.kv[:, :, 0, :, :21], atol=ATOL, rtol=RTOL
    )


@pytest.mark.parametrize(
    "slots",
    [[0, 1, 2], [3, 0, 2], [8, 0, 4]],
    ids=["packed-view", "scattered-queries", "gathered-rows"],
)
@torch.inference_mode()
def test_mixed_batch_decode_matches_each_sequence_alone(models, slots: list[int]) -> None:
    ref, ours, shape = models
    cache = SlotKVCache(shape, num_slots=9, max_tokens=64, device="cpu", dtype=torch.float32)
    seqs = [torch.randn(n, HIDDEN) for n in (5, 12, 20)]
    for slot, seq in zip(slots, seqs, strict=True):
        ours.prefill(slot, seq, 0, cache)

    # Three rows for three steps; then the first row leaves and a fourth request joins.
    late_slot, late_seq = 1 if 1 not in slots else 4, torch.randn(9, HIDDEN)
    ours.prefill(late_slot, late_seq, 0, cache)
    batches = [[0, 1, 2]] * 3 + [[1, 2, 3]] * 2
    all_slots, all_seqs = slots + [late_slot], seqs + [late_seq]
    for rows in batches:
        step = torch.randn(len(rows), HIDDEN)
        slot_ids = torch.tensor([all_slots[r] for r in rows])
        positions = torch.tensor([len(all_seqs[r]) for r in rows])
        hidden = ours.decode(slot_ids, step, positions, cache)
        for i, r in enumerate(rows):
            all_seqs[r] = torch.cat([all_seqs[r], step[i : i + 1]])
            torch.testing.assert_close(
                hidden[i], _reference_last(ref, all_seqs[r]), atol=ATOL, rtol=RTOL
            )


@pytest.mark.parametrize("decode_slots", [[0, 2], [5, 0]], ids=["slot-range", "gathered"])
@torch.inference_mode()
def test_one_forward_for_a_step_matches_each_part_alone(models, decode_slots) -> None:
    """Prompt chunks (new prompts, and the rest of one begun last step) and a decode batch
    in one forward: each row as transformers computes its own sequence, each cache slot as
    if its part had run alone."""
    ref, ours, shape = models
    cache = SlotKVCache(shape, num_slots=9, max_tokens=64, device="cpu", dtype=torch.float32)
    decoding = [torch.randn(n, HIDDEN) for n in (6, 11)]
    for slot, seq in zip(decode_slots, decoding, strict=True):
        ours.prefill(slot, seq, 0, cache)
    begun = torch.randn(15, HIDDEN)
    ours.prefill(3, begun[:7], 0, cache)
    new_prompts = {1: torch.randn(9, HIDDEN), 8: torch.randn(4, HIDDEN)}

    step = torch.randn(2, HIDDEN)
    prompt_hidden, decode_hidden = ours.forward_batch(
        [
            PromptRun(1, new_prompts[1], 0),
            PromptRun(3, begun[7:], 7),
            PromptRun(8, new_prompts[8], 0),
        ],
        DecodeBatch(torch.tensor(decode_slots), step, torch.tensor([6, 11])),
        cache,
    )
    expected = [ref(inputs_embeds=p[None]).last_hidden_state[0] for p in (new_prompts[1], begun)]
    torch.testing.assert_close(prompt_hidden[0], expected[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(prompt_hidden[1], expected[1][7:], atol=ATOL, rtol=RTOL)
    assert prompt_hidden[2].shape == (4, HIDDEN)
    assert decode_hidden is not None
    for i, seq in enumerate(decoding):
        whole = torch.cat([seq, step[i : i + 1]])
        torch.testing.assert_close(
            decode_hidden[i], _reference_last(ref, whole), atol=ATOL, rtol=RTOL
        )
    # The caches hold what separate forwards write: slot 8's prompt as a prefill alone would.
    alone = SlotKVCache(shape, num_slots=1, max_tokens=64, device="cpu", dtype=torch.float32)
    ours.prefill(0, new_prompts[8], 0, alone)
    torch.testing.assert_close(
        cache.kv[:, :, 8, :, :4], alone.kv[:, :, 0, :, :4], atol=ATOL, rtol=RTOL
    )


@torch.inference_mode()
def test_reused_slot_leaks_nothing() -> None:
    _, ours, shape = _models(4)

    def run(cache: SlotKVCache, prompt: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        outs = [ours.prefill(1, prompt, 0, cache)]
        for i, x in enumerate(steps):
            pos = torch.tensor([len(prompt) + i])
            outs.append(ours.decode(torch.tensor([1]), x[None], pos, cache))
        return torch.cat(outs)

    used = SlotKVCache(shape, num_slots=2, max_tokens=64, device="cpu", dtype=torch.float32)
    run(used, torch.randn(30, HIDDEN), torch.randn(6, HIDDEN))  # a long request, then freed
    prompt, steps = torch.randn(8, HIDDEN), torch.randn(3, HIDDEN)
    fresh = SlotKVCache(shape, num_slots=2, max_tokens=64, device="cpu", dtype=torch.float32)
    torch.testing.assert_close(run(used, prompt, steps), run(fresh, prompt, steps), rtol=0, atol=0)


def test_cache_is_one_allocation() -> None:
    _, _, shape = _models(2)
    cache = SlotKVCache(shape, num_slots=3, max_tokens=40, device="cpu", dtype=torch.float32)
    assert (cache.num_slots, cache.max_tokens) == (3, 40)
    per_slot = SlotKVCache.bytes_per_slot(shape, 40, torch.float32)
    assert cache.nbytes == 3 * per_slot == 2 * 2 * 3 * 2 * 40 * 32 * 4
    with pytest.raises(ValueError):
        SlotKVCache(shape, num_slots=1, max_tokens=129, device="cpu", dtype=torch.float32)
