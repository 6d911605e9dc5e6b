"""Linear modes of the GPT (model/linear_modes.py) and the warm-up autotune (model/autotune.py).

Each mode's forward is held against transformers' LlamaModel (fp32) on the same weights, as an
SNR of the hidden states, with these tolerances:

| mode                 | tiny model (2 layers) | one full-size layer (768/3072/12 heads) |
|----------------------|-----------------------|-----------------------------------------|
| dense, dense-onednn  | atol/rtol 1e-4        | atol/rtol 1e-4                          |
| bf16                 | >= 40 dB              | >= 40 dB                                |
| int8, int8-onednn    | >= 30 dB              | >= 30 dB                                |
(offered only with VNNI: test_cpu_features.py; run as other CPUs by test_cpu_kinds.py)
| int8-wo              | >= 30 dB              | >= 30 dB                                |
| <int8 mode>-mixedN   | >= 30 dB (9 layers)   | (all bf16 in one layer)                 |

(Observed: bf16 ~50 dB, int8 ~40 dB; the full 20-layer figures are in bench/results/quality.md.)
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.defaults import MIN_SNR_DB as CONFIG_MIN_SNR_DB
from chattts_server.model.attention import bf16_attention_faster
from chattts_server.model.autotune import autotune, measure_snr, snr_db
from chattts_server.model.kv_cache import SlotKVCache
from chattts_server.model.linear_modes import MODES, modes_for
from chattts_server.model.llama import LlamaDecoder, LlamaShape, served_kv_dtype

CPU, FP32 = torch.device("cpu"), torch.float32
AVAILABLE = modes_for("auto", CPU, FP32)
MIN_SNR_DB = {"bf16": 40.0, "int8": 30.0}


def _config(hidden: int, inter: int, heads: int, layers: int) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=layers,
        max_position_embeddings=128,
        vocab_size=8,
    )


def _reference(config: LlamaConfig, scale: float) -> LlamaModel:
    torch.manual_seed(0)
    ref = LlamaModel(config).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(
                1 + 0.1 * torch.randn_like(p) if "norm" in name else scale * torch.randn_like(p)
            )
    return ref


def _check(mode: str, expected: torch.Tensor, got: torch.Tensor) -> None:
    if MODES[mode].lossless:
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    else:
        snr = snr_db(expected, got)
        assert snr >= MIN_SNR_DB[MODES[mode].family], f"{mode}: SNR {snr:.1f} dB"


@pytest.mark.parametrize(
    "shape",
    [(128, 256, 4, 2, 0.1), (768, 3072, 12, 1, 0.02)],
    ids=["tiny", "full-size-layer"],
)
@pytest.mark.parametrize("mode", AVAILABLE)
@torch.inference_mode()
def test_mode_matches_llama_model(mode: str, shape: tuple[int, int, int, int, float]) -> None:
    hidden, inter, heads, layers, scale = shape
    config = _config(hidden, inter, heads, layers)
    ref = _reference(config, scale)
    ours = LlamaDecoder.from_state_dict(config, ref.state_dict(), CPU, FP32, modes=[mode])
    cache = SlotKVCache(LlamaShape.from_config(config), 2, 64, CPU, FP32)
    seq = torch.randn(13, hidden)
    expected = ref(inputs_embeds=seq[None]).last_hidden_state[0]
    _check(mode, expected[:12], ours.prefill(1, seq[:12], 0, cache))
    step = ours.decode(torch.tensor([1]), seq[12:], torch.tensor([12]), cache)
    _check(mode, expected[12:], step)


def test_quantize_names_the_families() -> None:
    assert {MODES[m].family for m in modes_for("none", CPU, FP32)} == {"none"}
    assert set(modes_for("auto", CPU, FP32)) >= set(modes_for("none", CPU, FP32))
    for family in ("bf16", "int8"):
        names = [m for m in AVAILABLE if MODES[m].family == family]
        if names:
            assert modes_for(family, CPU, FP32) == names
    # Lossy modes exist only for an fp32 model on CPU.
    assert {MODES[m].family for m in modes_for("auto", CPU, torch.bfloat16)} == {"none"}
    with pytest.raises(ValueError):
        modes_for("int4", CPU, FP32)


def _tiny_decoder(quantize: str) -> tuple[LlamaDecoder, SlotKVCache]:
    config = _config(128, 256, 4, 2)
    ref = _reference(config, 0.1)
    ours = LlamaDecoder.from_state_dict(config, ref.state_dict(), CPU, FP32, quantize=quantize)
    return ours, SlotKVCache(LlamaShape.from_config(config), 8, 96, CPU, ours.kv_dtype)


def test_autotune_picks_a_valid_mode_per_batch_size_logs_it_and_frees_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ours, cache = _tiny_decoder("auto")
    built = ours.modes
    before = ours.weight_bytes()
    with caplog.at_level(logging.INFO, logger="chattts_server.model.autotune"):
        result = autotune(ours, [1, 2, 4, 8], cache, steps=2)
    assert set(result.table) == {1, 2, 4, 8}
    assert set(result.table.values()) <= set(built)
    assert ours.mode_table == result.table
    assert all(set(result.ms[b]) <= set(built) for b in result.table)
    assert all(result.table[b] == min(result.ms[b], key=result.ms[b].get) for b in result.table)
    assert set(ours.modes) == {*result.table.values(), result.prefill_mode}
    assert result.prefill_mode == min(result.prefill_ms, key=result.prefill_ms.get)
    assert ours.prefill_mode == result.prefill_mode
    assert f"chosen {result.prefill_mode}" in caplog.text
    assert ours.weight_bytes() <= before
    # Lossy modes are checked against the budget; with K/V in bf16, every mode is.
    lossy_kv = ours.kv_dtype != FP32
    assert set(result.snr_db) == {m for m in built if lossy_kv or not MODES[m].lossless}
    logged = caplog.text
    assert "linear-mode autotune" in logged
    for batch, mode in result.table.items():
        assert f"  {mode}" in logged and f"\n{batch:>5} " in logged
    # The tuned decoder still computes the same function (lossy modes within budget).
    with torch.inference_mode():
        x = torch.randn(3, 128)
        ours.decode(torch.arange(3), x, torch.tensor([5, 6, 7]), cache)


def test_auto_excludes_modes_under_the_quality_budget() -> None:
    ours, cache = _tiny_decoder("auto")
    result = autotune(ours, [1, 4], cache, min_snr_db=300.0, steps=1)
    lossy = {m for m in AVAILABLE if ours.kv_dtype != FP32 or not MODES[m].lossless}
    assert set(result.excluded) == lossy
    # Nothing within budget (with K/V in bf16 not even fp32 linears): the lossless fallback.
    assert all(MODES[m].lossless for m in result.table.values())


@torch.inference_mode()
def test_auto_serves_no_mode_under_its_budget_against_llama_model() -> None:
    """Whatever this CPU offers, the modes autotune keeps give hidden states within the budget
    of transformers' fp32 LlamaModel (run as other CPUs by test_cpu_kinds.py)."""
    config = _config(128, 256, 4, 9)
    ref = _reference(config, 0.1)
    ours = LlamaDecoder.from_state_dict(config, ref.state_dict(), CPU, FP32, quantize="auto")
    cache = SlotKVCache(LlamaShape.from_config(config), 4, 64, CPU, ours.kv_dtype)
    probe = torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    result = autotune(ours, [1, 4], cache, probe=probe, steps=1)
    expected = ref(inputs_embeds=probe[None]).last_hidden_state[0]
    for mode in {*result.table.values(), result.prefill_mode}:
        got = ours.prefill(0, probe, 0, cache, mode=mode)
        assert snr_db(expected, got) >= CONFIG_MIN_SNR_DB - 0.5, mode
    assert not set(result.excluded) & {*result.table.values(), result.prefill_mode}


def test_forced_int8_builds_only_int8_weights_and_reports_their_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if "int8" not in AVAILABLE:
        pytest.skip("no fbgemm int8 engine in this torch build")
    with caplog.at_level(logging.INFO, logger="chattts_server.model.llama"):
        ours, cache = _tiny_decoder("int8")
    assert {MODES[m].family for m in ours.modes} == {"int8"}
    assert "GPT linear weights (int8)" in caplog.text
    dense, _ = _tiny_decoder("none")
    # int8 weights take about a quarter of fp32's (plus per-channel scales).
    assert ours.weight_bytes("int8") < 0.3 * dense.weight_bytes("dense")
    result = autotune(ours, [1, 2], cache, steps=1)
    assert not result.snr_db  # forced: no budget check
    assert set(result.table.values()) <= {m for m in AVAILABLE if MODES[m].family == "int8"}


@torch.inference_mode()
def test_lossy_quantize_keeps_kv_in_bf16_where_faster_and_within_budget() -> None:
    config = _config(128, 256, 4, 2)
    ref = _reference(config, 0.1)
    exact = LlamaDecoder.from_state_dict(config, ref.state_dict(), CPU, FP32, quantize="none")
    assert exact.kv_dtype == FP32
    if "bf16" not in AVAILABLE:
        pytest.skip("no fast bf16 on this CPU")
    served = LlamaDecoder.from_state_dict(config, ref.state_dict(), CPU, FP32, quantize="bf16")
    faster = bf16_attention_faster(4, 32)
    assert served.kv_dtype == (torch.bfloat16 if faster else FP32)
    assert served_kv_dtype(served.shape, CPU, FP32, lossy=True) == served.kv_dtype
    ours = LlamaDecoder.from_state_dict(
        config, ref.state_dict(), CPU, FP32, quantize="bf16", kv_dtype=torch.bfloat16
    )
    cache = SlotKVCache(LlamaShape.from_config(config), 3, 64, CPU, ours.kv_dtype)
    seq = torch.randn(13, 128)
    expected = ref(inputs_embeds=seq[None]).last_hidden_state[0]
    got = torch.cat(
        [
            ours.prefill(2, seq[:12], 0, cache),
            ours.decode(torch.tensor([2]), seq[12:], torch.tensor([12]), cache),
        ]
    )
    assert got.dtype == FP32
    assert snr_db(expected, got) >= MIN_SNR_DB["bf16"]


def test_mode_table_lookup_takes_the_smallest_size_at_least_the_batch() -> None:
    ours, _ = _tiny_decoder("none")
    a, b = ours.modes[0], ours.modes[-1]
    ours.set_mode_table({1: a, 4: b, 16: a})
    assert [ours.mode_for(n) for n in (1, 2, 3, 4, 5, 16, 40)] == [a, b, b, b, a, a, a]
    with pytest.raises(ValueError):
        ours.set_mode_table({1: "int4"})


def test_metrics_publish_the_mode_table() -> None:
    from prometheus_client import generate_latest

    from chattts_server.metrics import Metrics

    metrics = Metrics()
    metrics.set_linear_modes({1: "int8", 16: "bf16"})
    metrics.set_linear_modes({1: "bf16", 16: "bf16"})  # a new table replaces the old one
    text = generate_latest(metrics.registry).decode()
    assert 'chattts_gpt_linear_mode{batch_size="1",mode="bf16"} 1.0' in text
    assert 'chattts_gpt_linear_mode{batch_size="16",mode="bf16"} 1.0' in text
    assert 'mode="int8"' not in text


@pytest.mark.parametrize(
    "slots", [[0, 1, 2], [3, 0, 2], [8, 0, 4]], ids=["packed", "scattered", "gathered"]
)
@torch.inference_mode()
def test_bf16_kv_decode_in_every_slot_layout(slots: list[int]) -> None:
    if "bf16" not in AVAILABLE:
        pytest.skip("no fast bf16 on this CPU")
    config = _config(128, 256, 4, 2)
    ref = _reference(config, 0.1)
    ours = LlamaDecoder.from_state_dict(config, ref.state_dict(), CPU, FP32, modes=["dense-onednn"])
    cache = SlotKVCache(LlamaShape.from_config(config), 9, 64, CPU, torch.bfloat16)
    seqs = [torch.randn(n, 128) for n in (5, 12, 20)]
    for slot, seq in zip(slots, seqs, strict=True):
        ours.prefill(slot, seq, 0, cache)
    step = torch.randn(3, 128)
    positions = torch.tensor([len(s) for s in seqs])
    hidden = ours.decode(torch.tensor(slots), step, positions, cache)
    for i, seq in enumerate(seqs):
        full = torch.cat([seq, step[i : i + 1]])
        expected = ref(inputs_embeds=full[None]).last_hidden_state[0, -1]
        assert snr_db(expected, hidden[i]) >= MIN_SNR_DB["bf16"]


def _deep_tiny(quantize: str = "none", modes: list[str] | None = None) -> LlamaDecoder:
    # Nine layers, so that every <int8 mode>-mixedN has int8 layers after its bf16 ones.
    config = _config(128, 256, 4, 9)
    ref = _reference(config, 0.1)
    return LlamaDecoder.from_state_dict(
        config, ref.state_dict(), CPU, FP32, quantize=quantize, modes=modes
    )


@pytest.mark.parametrize("mode", [m for m in AVAILABLE if MODES[m].per_layer])
@torch.inference_mode()
def test_mixed_mode_runs_bf16_first_layers_then_int8_and_matches_llama_model(mode: str) -> None:
    config = _config(128, 256, 4, 9)
    ref = _reference(config, 0.1)
    ours = LlamaDecoder.from_state_dict(
        config, ref.state_dict(), CPU, FP32, modes=["bf16", mode.rsplit("-mixed", 1)[0], mode]
    )
    int8, num_bf16 = mode.rsplit("-mixed", 1)
    for i, layer in enumerate(ours.layers):
        for proj in layer.projections():
            base = "bf16" if i < int(num_bf16) else int8
            assert proj.kernels[mode] is proj.kernels[base]  # shared, not a copy
    # Shared kernels count once: all three modes hold bf16's and the int8 mode's bytes.
    assert ours.weight_bytes() == ours.weight_bytes("bf16") + ours.weight_bytes(int8)
    assert ours.weight_bytes(int8) < ours.weight_bytes(mode) < ours.weight_bytes("bf16")
    cache = SlotKVCache(LlamaShape.from_config(config), 2, 64, CPU, FP32)
    seq = torch.randn(13, 128)
    expected = ref(inputs_embeds=seq[None]).last_hidden_state[0]
    got = ours.prefill(0, seq[:12], 0, cache, mode=mode)
    step = ours.decode(torch.tensor([0]), seq[12:], torch.tensor([12]), cache, mode=mode)
    assert step.dtype == FP32
    assert snr_db(expected, torch.cat([got, step])) >= MIN_SNR_DB["int8"]
    # Keeping only the mixed mode keeps its kernels and frees what it does not use.
    ours.keep_modes({mode})
    assert ours.modes == [mode]
    assert ours.weight_bytes() == ours.weight_bytes(mode)
    again = ours.decode(torch.tensor([0]), seq[12:], torch.tensor([12]), cache, mode=mode)
    torch.testing.assert_close(again, step)


@torch.inference_mode()
def test_auto_admits_a_mixed_mode_that_clears_the_budget_int8_wo_does_not() -> None:
    if "int8-wo-mixed2" not in AVAILABLE:
        pytest.skip("no fast bf16 / int8 weight-only kernels on this CPU")
    ours = _deep_tiny("auto")
    config = _config(128, 256, 4, 9)
    cache = SlotKVCache(LlamaShape.from_config(config), 4, 64, CPU, ours.kv_dtype)
    probe = torch.randn(32, 128, generator=torch.Generator().manual_seed(0))
    snr = measure_snr(ours, probe, "dense", ["int8-wo", "int8-wo-mixed2", "bf16"])
    # Keeping layers in bf16 removes their int8 error: mixed lands between int8-wo and bf16.
    assert snr["int8-wo"] < snr["int8-wo-mixed2"] <= snr["bf16"] + 0.5
    budget = (snr["int8-wo"] + snr["int8-wo-mixed2"]) / 2
    result = autotune(ours, [1, 2], cache, probe=probe, min_snr_db=budget, steps=1)
    assert "int8-wo" in result.excluded and "int8-wo-mixed2" not in result.excluded
    assert all(m not in result.excluded for m in result.table.values())
    assert any("int8-wo-mixed2" in row for row in result.ms.values())
