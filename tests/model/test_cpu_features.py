"""Which linear modes each kind of x86 CPU is offered (model/cpu_features.py,
linear_modes.LinearMode.why_not), decided from the flags alone: every kind is checked here on
any machine. The kernels themselves run under each kind in tests/model/test_cpu_kinds.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.model.cpu_features import CpuFeatures, cpu_features, library_caps, read_cpuinfo
from chattts_server.model.linear_modes import MODES, modes_for, onednn_available, unavailable_modes
from chattts_server.model.llama import LlamaDecoder

CPU, FP32 = torch.device("cpu"), torch.float32
BASE = {"sse2", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c"}
AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
KINDS = {
    "epyc-avx2": BASE,
    "alder-lake": BASE | {"avx_vnni"},
    "skylake-sp": BASE | AVX512,
    "cascade-lake": BASE | AVX512 | {"avx512_vnni"},
    "zen4": BASE | AVX512 | {"avx512_vnni", "avx512_bf16"},
    "sapphire-rapids": BASE
    | AVX512
    | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"},
}
LOSSLESS = {"dense", "dense-onednn"}
INT8_DYNAMIC = {"int8", "int8-onednn"}
EVERY = set(MODES)
EXPECTED = {
    "epyc-avx2": LOSSLESS,
    "alder-lake": LOSSLESS | INT8_DYNAMIC,
    "skylake-sp": LOSSLESS,
    "cascade-lake": LOSSLESS | INT8_DYNAMIC,
    "zen4": EVERY,
    "sapphire-rapids": EVERY,
}

needs_engines = pytest.mark.skipif(
    not onednn_available()
    or not {"fbgemm", "onednn"} <= set(torch.backends.quantized.supported_engines)
    or not hasattr(torch, "_weight_int8pack_mm"),
    reason="this torch build lacks oneDNN linear ops or an int8 engine",
)


def _kind(name: str, **caps: str) -> CpuFeatures:
    return CpuFeatures(frozenset(KINDS[name]), library_caps(caps), name)


@needs_engines
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_cpu_kind_is_offered_exactly_the_modes_its_instructions_make_exact(kind: str) -> None:
    assert set(modes_for("auto", CPU, FP32, _kind(kind))) == EXPECTED[kind]
    assert set(modes_for("none", CPU, FP32, _kind(kind))) == LOSSLESS


@needs_engines
def test_a_library_capped_below_vnni_loses_its_int8_mode_alone() -> None:
    fbgemm_avx2 = _kind("cascade-lake", FBGEMM_ENABLE_INSTRUCTIONS="AVX2")
    assert set(modes_for("int8", CPU, FP32, fbgemm_avx2)) == {"int8-onednn"}
    onednn_avx2 = _kind("zen4", ONEDNN_MAX_CPU_ISA="AVX2")
    # oneDNN capped: its bf16 and int8 go, and with bf16 every mode built on it.
    assert set(modes_for("auto", CPU, FP32, onednn_avx2)) == {"dense", "dense-onednn", "int8"}


@needs_engines
def test_forced_int8_without_vnni_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match=r"--quantize int8 has no kernel .*no VNNI for fbgemm"):
        modes_for("int8", CPU, FP32, _kind("epyc-avx2"))
    reasons = unavailable_modes("auto", CPU, FP32, _kind("epyc-avx2"))
    assert set(reasons) == EVERY - LOSSLESS
    assert "saturate in 16-bit pairs" in reasons["int8"]
    assert "AVX512-BF16 or AMX" in reasons["bf16"]


def test_lossy_modes_stay_off_gpus_and_non_fp32_models() -> None:
    zen4 = _kind("zen4")
    assert set(modes_for("auto", torch.device("cuda"), torch.float16, zen4)) == {"dense"}
    assert all(MODES[m].lossless for m in modes_for("auto", CPU, torch.bfloat16, zen4))


def test_library_caps_read_each_librarys_own_variable() -> None:
    assert library_caps({}) == {"onednn": None, "fbgemm": None, "aten": None}
    caps = library_caps(
        {"DNNL_MAX_CPU_ISA": "avx512_core", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1"}
    )
    assert caps == {"onednn": "AVX512_CORE", "fbgemm": "AVX512_CORE_VNNI", "aten": None}
    assert library_caps({"ONEDNN_MAX_CPU_ISA": "DEFAULT"})["onednn"] is None
    zen4 = _kind("zen4", ONEDNN_MAX_CPU_ISA="AVX512_CORE_VNNI")
    assert zen4.vnni("onednn") and not zen4.native_bf16("onednn")
    assert zen4.native_bf16("aten")  # uncapped there
    assert "onednn capped at AVX512_CORE_VNNI" in zen4.describe()


def test_read_cpuinfo_takes_the_first_cpu(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: sse2\n"
    )
    assert read_cpuinfo(path) == ("AMD EPYC", frozenset({"avx2", "fma"}))
    assert read_cpuinfo(tmp_path / "missing") == ("unknown CPU", frozenset())


def test_this_machine_reports_what_it_gets(caplog: pytest.LogCaptureFixture) -> None:
    """Not an assertion about this CPU's figures: the log says what it was offered and why the
    rest was left out, for the CI log to show which kind of machine ran the suite."""
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_hidden_layers=1,
        vocab_size=8,
    )
    with caplog.at_level(logging.INFO, logger="chattts_server.model.linear_modes"):
        ours = LlamaDecoder.from_state_dict(
            config, LlamaModel(config).state_dict(), CPU, FP32, quantize="auto"
        )
    offered = modes_for("auto", CPU, FP32)
    assert ours.modes[0] in offered and set(ours.modes) == set(offered)
    left_out = unavailable_modes("auto", CPU, FP32)
    if left_out:
        assert f"GPT linear modes left out on {cpu_features().describe()}" in caplog.text
        assert all(f"{name} ({why})" in caplog.text for name, why in left_out.items())
    print(f"\n{cpu_features().describe()}: offered {offered}; left out {sorted(left_out)}")
