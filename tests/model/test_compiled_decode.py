"""The torch.compile'd decode step (model/compiled_decode.py) against the eager one and against
transformers' LlamaModel, on the tiny model, with the parity tests' tolerances: atol/rtol 1e-4
for the lossless modes (test_llama_parity.py), the mode's SNR bound for a lossy one
(test_linear_modes.py: int8 >= 30 dB against fp32).

Compiling takes minutes on a loaded 2-core machine (much less once inductor's cache holds the
graphs), so each mode compiles once per module: the decoders built here share the structure
dynamo guards on, so a second decoder reuses the first's graphs.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.model.autotune import snr_db
from chattts_server.model.compiled_decode import tune_compiled
from chattts_server.model.kv_cache import SlotKVCache
from chattts_server.model.linear_modes import MODES, modes_for
from chattts_server.model.llama import DecodeBatch, LlamaDecoder, LlamaShape

CPU, FP32 = torch.device("cpu"), torch.float32
AVAILABLE = modes_for("auto", CPU, FP32)
HIDDEN = 128


pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module", autouse=True)
def _fresh_dynamo() -> None:
    """Graphs of other test modules do not count against dynamo's recompile limit here."""
    torch._dynamo.reset()


def _models(mode: str, num_kv_heads: int = 2) -> tuple[LlamaModel, LlamaDecoder, LlamaShape]:
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
    with torch.no_grad():  # as test_llama_parity: attention far from uniform
        for name, p in ref.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    ours = LlamaDecoder.from_state_dict(
        config, ref.state_dict(), CPU, FP32, modes=[mode], kv_dtype=FP32
    )
    return ref, ours, LlamaShape.from_config(config)


def _prompts(
    ours: LlamaDecoder, cache: SlotKVCache, lengths: dict[int, int]
) -> dict[int, torch.Tensor]:
    prompts = {slot: torch.randn(n, HIDDEN) for slot, n in lengths.items()}
    for slot, prompt in prompts.items():
        ours.prefill(slot, prompt, 0, cache)
    return prompts


@torch.inference_mode()
def _decode_both(mode: str, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(LlamaModel's last hidden state per row, eager decode, compiled decode) for one decode
    step of rows in ``slots`` at different positions (GQA: 4 query heads over 2 K/V heads)."""
    ref, ours, shape = _models(mode)
    lengths = {slot: 5 + 3 * i for i, slot in enumerate(slots)}
    eager_cache = SlotKVCache(shape, 8, 64, CPU, FP32)
    compiled_cache = SlotKVCache(shape, 8, 64, CPU, FP32)
    torch.manual_seed(1)
    prompts = _prompts(ours, eager_cache, lengths)
    step = torch.randn(len(slots), HIDDEN)
    ids = torch.tensor(slots)
    positions = torch.tensor([lengths[s] for s in slots])
    eager = ours.decode(ids, step, positions, eager_cache)
    # Warm-up first (it writes garbage K/V), then the prompts, as the server does.
    result = tune_compiled(ours, [1, len(slots)], compiled_cache, "on", budget_s=600.0)
    assert result.chosen == {1: True, len(slots): True}
    assert ours.compiled is not None and ours.compiled.covers(len(slots), mode)
    for slot, prompt in prompts.items():
        ours.prefill(slot, prompt, 0, compiled_cache)
    ours.compiled.on_miss = "fail_on_recompile"  # warm-up's graphs serve these rows
    _, compiled = ours.forward_batch([], DecodeBatch(ids, step, positions), compiled_cache)
    assert compiled is not None
    expected = torch.stack(
        [
            ref(inputs_embeds=torch.cat([prompts[s], step[i : i + 1]])[None]).last_hidden_state[
                0, -1
            ]
            for i, s in enumerate(slots)
        ]
    )
    # The compiled step wrote the K/V the eager one did (a lossy mode: to its rounding; the
    # fused norm rounds a few bf16 kernel inputs the other way).
    for s, n in lengths.items():
        got, want = compiled_cache.kv[:, :, s, :, : n + 1], eager_cache.kv[:, :, s, :, : n + 1]
        if MODES[mode].lossless:
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        else:
            assert snr_db(want, got) >= 40.0
    return expected, eager, compiled


@pytest.mark.parametrize("slots", [[0, 1, 2], [1, 4, 6]], ids=["consecutive", "scattered"])
def test_compiled_decode_matches_eager_and_llama_model(slots: list[int]) -> None:
    expected, eager, compiled = _decode_both("dense", slots)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(m, marks=pytest.mark.skipif(m not in AVAILABLE, reason=f"no {m} here"))
        for m in ("int8-wo", "int8")
    ],
)
def test_compiled_int8_decode_stays_within_its_budget(mode: str) -> None:
    """Weight-only int8 (an aten op in the graph) and dynamic int8 (its packed weight reached
    through chattts::int8_dynamic_linear)."""
    expected, eager, compiled = _decode_both(mode, [0, 1])
    assert snr_db(expected, compiled) >= 30.0
    assert snr_db(eager, compiled) >= 40.0  # only the fused ops' rounding differs


@torch.inference_mode()
def test_off_compiles_nothing() -> None:
    _, ours, shape = _models("dense")
    cache = SlotKVCache(shape, 4, 32, CPU, FP32)
    result = tune_compiled(ours, [1, 2], cache, "off", budget_s=600.0)
    assert not result.chosen and not result.skipped and ours.compiled is None


@torch.inference_mode()
def test_spent_budget_leaves_the_remaining_sizes_eager() -> None:
    _, ours, shape = _models("dense")
    cache = SlotKVCache(shape, 4, 32, CPU, FP32)
    # The budget is checked before each graph: none starts once it is spent.
    result = tune_compiled(ours, [1, 2, 4], cache, "on", budget_s=0.0)
    assert not result.chosen and ours.compiled is None
    assert all("budget 0 s spent" in why for why in result.skipped.values()), result.skipped
