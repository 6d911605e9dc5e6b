"""The CPU's instruction sets as each kernel library will use them.

Which linear kernels are exact enough depends on instructions, not on the CPU's name: without
VNNI, the int8 kernels of fbgemm and oneDNN multiply u8 x s8 pairs with ``vpmaddubsw``, whose
16-bit sums saturate (hidden-state SNR 16-25 dB on the tiny model instead of ~40).

Each library can be told to use fewer instructions than the CPU has, and that is how the tests
stand in for another CPU on this one (tests/model/test_cpu_kinds.py): ``ONEDNN_MAX_CPU_ISA``
(oneDNN's own cap, which torch's oneDNN honours), ``FBGEMM_ENABLE_INSTRUCTIONS`` (fbgemm's) and
``ATEN_CPU_CAPABILITY`` (torch's vectorised kernels). :func:`cpu_features` reads those caps
beside /proc/cpuinfo, so that what we decide is what the kernels will do.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Instruction-set levels, lowest first, and the /proc/cpuinfo flags each adds. A library capped
# at a level keeps that level's flags and the levels below it; flags of no level always stay.
_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("SSE41", frozenset({"sse4_1", "sse4_2"})),
    ("AVX2", frozenset({"avx", "avx2", "fma", "f16c"})),
    ("AVX2_VNNI", frozenset({"avx_vnni"})),
    ("AVX2_VNNI_2", frozenset({"avx_vnni_int8", "avx_ne_convert"})),
    ("AVX512_CORE", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})),
    ("AVX512_CORE_VNNI", frozenset({"avx512_vnni"})),
    ("AVX512_CORE_BF16", frozenset({"avx512_bf16"})),
    ("AVX512_CORE_AMX", frozenset({"amx_tile", "amx_int8", "amx_bf16"})),
)
_LEVEL_NAMES = [name for name, _ in _LEVELS]

# Each library's cap variable, and its values -> our level names.
_CAPS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "onednn": (
        ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"),
        {
            **{name: name for name in _LEVEL_NAMES},
            "AVX512_CORE_FP16": "AVX512_CORE_BF16",
            "AVX10_1_512": "AVX512_CORE_BF16",
            "AVX512_CORE_AMX_FP16": "AVX512_CORE_AMX",
            "AVX10_1_512_AMX": "AVX512_CORE_AMX",
            "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX",
        },
    ),
    "fbgemm": (
        ("FBGEMM_ENABLE_INSTRUCTIONS",),
        {
            "AVX2": "AVX2",
            "AVX512": "AVX512_CORE",
            "AVX512_256": "AVX512_CORE",
            "AVX512_E1": "AVX512_CORE_VNNI",
            "AVX512_E1_256": "AVX512_CORE_VNNI",
        },
    ),
    "aten": (
        ("ATEN_CPU_CAPABILITY",),
        {"DEFAULT": "SSE41", "AVX2": "AVX2", "AVX512": "AVX512_CORE_BF16"},
    ),
}

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""Any of these gives int8 dot products that accumulate u8 x s8 in 32 bits (no saturation)."""
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""Native bf16 matmuls in oneDNN; without them it converts to fp32 and gains nothing."""


def _capped(flags: frozenset[str], level: str | None) -> frozenset[str]:
    if level is None:
        return flags
    above = _LEVEL_NAMES.index(level) + 1
    dropped = frozenset().union(*(added for _, added in _LEVELS[above:]))
    return flags - dropped


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's flags, and the caps the kernel libraries run under (None: uncapped)."""

    flags: frozenset[str]
    caps: Mapping[str, str | None]
    """library ('onednn', 'fbgemm', 'aten') -> the level it is capped at, or None."""
    model: str = "unknown CPU"

    def for_library(self, library: str) -> frozenset[str]:
        """The flags ``library`` will use: the CPU's, less what its cap leaves out."""
        return _capped(self.flags, self.caps.get(library))

    def vnni(self, library: str) -> bool:
        return bool(VNNI_FLAGS & self.for_library(library))

    def native_bf16(self, library: str = "onednn") -> bool:
        return bool(BF16_FLAGS & self.for_library(library))

    def describe(self) -> str:
        """One line for logs and CI: the model, the SIMD flags that matter, and any caps."""
        shown = sorted(f for f in self.flags if f.startswith(("avx", "amx")) or f == "fma")
        caps = ", ".join(f"{lib} capped at {lvl}" for lib, lvl in self.caps.items() if lvl)
        return f"{self.model}: {' '.join(shown) or 'no AVX'}" + (f" ({caps})" if caps else "")


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ('unknown CPU', {}) if unread."""
    model, flags = "unknown CPU", frozenset[str]()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return model, flags
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and model == "unknown CPU" and value.strip():
            model = value.strip()
        elif name in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def library_caps(environ: Mapping[str, str]) -> dict[str, str | None]:
    """Each library's cap from its own variable in ``environ`` (unknown values: no cap, as the
    libraries themselves ignore them)."""
    caps: dict[str, str | None] = {}
    for library, (names, levels) in _CAPS.items():
        value = next((environ[n] for n in names if environ.get(n)), "")
        caps[library] = levels.get(value.strip().upper())
    return caps


@functools.cache
def cpu_features() -> CpuFeatures:
    """This machine's features as the kernels see them (read once, at first use)."""
    model, flags = read_cpuinfo()
    return CpuFeatures(flags, library_caps(os.environ), model)
