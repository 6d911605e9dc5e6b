"""The autotune cache (model/autotune_cache.py): a second warm-up with the same machine, weights,
threads and setting applies the stored choice without timing; a changed key measures again; a
broken entry is measured over. Tiny random Llama decoders, real timing, a temporary folder."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.model.autotune_cache import (
    AutotuneCache,
    cpu_identity,
    tune_or_reuse,
    weights_digest,
)
from chattts_server.model.kv_cache import SlotKVCache
from chattts_server.model.llama import LlamaDecoder, LlamaShape

CPU, FP32 = torch.device("cpu"), torch.float32
SIZES = [1, 2]
MEASURED = "linear-mode autotune (--quantize auto, "


def _config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        max_position_embeddings=128,
        vocab_size=8,
    )


def _weights(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return LlamaModel(_config()).state_dict()


def _tune(
    weights: dict[str, torch.Tensor], store: AutotuneCache, caplog: pytest.LogCaptureFixture
) -> tuple[LlamaDecoder, str]:
    """One warm-up's autotune: a fresh decoder on `weights`; returns it and what it logged."""
    decoder = LlamaDecoder.from_state_dict(_config(), weights, CPU, FP32, quantize="auto")
    if len(decoder.modes) < 2:
        pytest.skip("one linear mode on this CPU: nothing to time, nothing to cache")
    cache = SlotKVCache(LlamaShape.from_config(_config()), 2, 64, CPU, decoder.kv_dtype)
    probe = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chattts_server.model"):
        tune_or_reuse(decoder, SIZES, cache, probe, store, weights_digest(weights))
    return decoder, caplog.text


def test_a_second_start_reuses_the_stored_choice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = AutotuneCache(tmp_path)
    weights = _weights(0)
    first, log1 = _tune(weights, store, caplog)
    assert "s; weights" in log1 and "stored in" in log1
    [entry] = tmp_path.glob("autotune-*.json")
    second, log2 = _tune(weights, store, caplog)
    assert f"reused {entry}" in log2
    assert "stored in" not in log2  # nothing measured, nothing written
    assert second.mode_table == first.mode_table
    assert second.prefill_mode == first.prefill_mode
    assert set(second.modes) == set(first.modes)  # the unchosen weights freed alike


def test_a_changed_key_measures_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = AutotuneCache(tmp_path)
    _tune(_weights(0), store, caplog)
    _, other_weights = _tune(_weights(1), store, caplog)
    assert "reused" not in other_weights and "stored in" in other_weights
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        _, other_threads = _tune(_weights(0), store, caplog)
    finally:
        torch.set_num_threads(threads)
    assert "reused" not in other_threads and "stored in" in other_threads
    assert len(list(tmp_path.glob("autotune-*.json"))) == 3


def test_a_broken_entry_is_measured_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = AutotuneCache(tmp_path)
    weights = _weights(0)
    _tune(weights, store, caplog)
    [entry] = tmp_path.glob("autotune-*.json")
    entry.write_text("{not json", encoding="utf-8")
    _, log = _tune(weights, store, caplog)
    assert "ignoring autotune cache entry" in log and "stored in" in log
    _, log = _tune(weights, store, caplog)
    assert "reused" in log


def test_the_key_holds_the_cpu_model_and_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: sse2 avx512f amx_tile\n\n"
        "processor\t: 1\nmodel name\t: Example CPU 9000\nflags\t\t: sse2 avx512f amx_tile\n",
        encoding="utf-8",
    )
    assert cpu_identity(cpuinfo) == {
        "cpu_model": "Example CPU 9000",
        "cpu_flags": "amx_tile avx512f sse2",
    }
