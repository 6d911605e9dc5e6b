"""Linear-layer kernels for the GPT's projections: the same ``x @ W.T + b`` in several formats.

A *mode* names one way to hold a weight and run the matmul. The decoder keeps the weights of
every allowed mode and picks one per decode batch size (see ``model/autotune.py``): what wins
on one CPU loses on another, so the choice is timed on the machine itself.

| mode          | weight                        | activations                         | family |
|---------------|-------------------------------|-------------------------------------|--------|
| dense         | model dtype, ``F.linear``     | model dtype                         | none   |
| dense-onednn  | model dtype, oneDNN-packed    | model dtype                         | none   |
| bf16          | bf16, oneDNN-packed (AVX512-BF16/AMX) | bf16 in, bf16 out           | bf16   |
| int8          | int8 per output channel, fbgemm (VNNI) | quantized per call (uint8, dynamic) | int8 |
| int8-onednn   | int8 per output channel, oneDNN (VNNI) | quantized per call (uint8, dynamic) | int8 |
| int8-wo       | int8 per output channel       | bf16 in, bf16 out (weight-only)     | int8   |
| int8-wo-mixed2, -mixed4 | bf16 in layers 0-1 (0-3), int8-wo in the rest | bf16        | int8   |
| int8-mixed6, -mixed8 | bf16 in layers 0-5 (0-7), int8 (dynamic) in the rest | as each layer's | int8 |

The mixed modes exist because the error of a layer's weights grows through every later layer: on
the dev model int8-wo in layers 0-9 alone cost as much SNR as in all 20 layers, and keeping the
first two layers in bf16 lifted the hidden-state SNR from 27 to 31 dB for 2/20 of bf16's extra
bytes (dynamic int8, which also quantizes activations, needs six: 24 -> 31 dB). Both kinds
exist because their kernels trade places between CPUs and batch sizes: ``_weight_int8pack_mm``
reads at the memory bandwidth at batch 1 with two threads but is instruction-bound on one and
slow beyond a few rows; fbgemm's VNNI kernel is not. They share their kernels with ``bf16``,
``int8-wo`` and ``int8`` where those are built too.

A kernel's ``input_dtype`` is what it computes in: the layer hands it activations already in that
dtype where it can (a bf16 attention output into the o projection, a bf16 gate/up product into
the down projection), and its output stays in that dtype; the residual add promotes back to
fp32. That saves two casts per projection, ~100 ops of a decode step.

A mode is offered only where its kernel is exact enough on this CPU (``LinearMode.why_not``,
reading ``model/cpu_features.py``): bf16 needs AVX512-BF16 or AMX, dynamic int8 needs VNNI. The
reasons for the others are logged when the decoder is built.

``--quantize`` names the families allowed: ``none`` (lossless), ``bf16``, ``int8``, or ``auto``
(every family, each lossy mode only if it keeps the hidden state within the quality budget).
Lossy modes exist only on CPU with an fp32 model: the residual stream, norms and rotary stay
fp32; the matmul inputs and weights change format (and the KV cache is bf16 where bf16 is fast,
see ``LlamaDecoder.from_state_dict``).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..defaults import QUANTIZE_CHOICES
from .cpu_features import CpuFeatures, cpu_features

log = logging.getLogger(__name__)

# Batch size oneDNN packs the weights for; measured to matter little between 1 and 64.
_ONEDNN_BATCH_HINT = 16


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN linear ops used for packed weights."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def _int8_engine(engine: str) -> bool:
    return engine in torch.backends.quantized.supported_engines


_LIBRARY = torch.library.Library("chattts", "DEF")
"""Ops that let compiled graphs (model/compiled_decode.py) call kernels inductor cannot."""


class DenseLinear(nn.Module):
    weight: Tensor
    bias: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.input_dtype = weight.dtype

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x.to(self.input_dtype), self.weight, self.bias)


class OneDNNLinear(nn.Module):
    """Weight in oneDNN's packed layout, run by ``torch.ops.mkldnn._linear_pointwise`` (the op
    torch's inductor uses for CPU linears). ``compute_dtype`` other than the input's (bf16 on an
    fp32 model) casts the input in; the output stays in ``compute_dtype``."""

    weight: Tensor
    bias: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None, compute_dtype: torch.dtype) -> None:
        super().__init__()
        w = weight.to(compute_dtype).contiguous()
        self.register_buffer(
            "weight", torch.ops.mkldnn._reorder_linear_weight(w, _ONEDNN_BATCH_HINT)
        )
        self.register_buffer("bias", None if bias is None else bias.to(compute_dtype))
        self.input_dtype = compute_dtype

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # model/compiled_decode.py: an opaque call
            return torch.ops.chattts.onednn_linear(x.to(self.input_dtype), self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.to(self.input_dtype), self.weight, self.bias, "none", [], ""
        )


def _onednn_linear_impl(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# ``OneDNNLinear`` inside a compiled graph: inductor lowers ``_linear_pointwise`` itself only for
# weights it froze as constants, and ours are inputs; this op it calls as is. (Defined through
# Library, not custom_op: custom_op's aliasing check cannot read an opaque oneDNN weight.)
_LIBRARY.define("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
for _key in ("CPU", "MkldnnCPU"):  # the packed weight dispatches as MkldnnCPU
    _LIBRARY.impl("onednn_linear", _onednn_linear_impl, _key)
torch.library.register_fake("chattts::onednn_linear", _onednn_linear_fake, lib=_LIBRARY)


def _int8_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per output channel: (int8 weight (N, K), fp32 scales (N,))."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


class DynamicInt8Linear(nn.Module):
    """``torch.ops.quantized.linear_dynamic``: int8 weights per output channel, the input
    quantized to uint8 (one scale per call) on the fly, int32 accumulation, fp32 out.

    The packed weight belongs to the quantized engine it was packed under (fbgemm or onednn).
    Both are offered only where that engine has VNNI (``_why_not_int8``): without it their
    u8 x s8 products saturate in 16-bit pairs, and 7-bit activations (``reduce_range``) that
    avoid the overflow cost ~6 dB, below the budget on the dev model.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, engine: str) -> None:
        super().__init__()
        q, scales = _int8_per_channel(weight)
        zero = torch.zeros(q.shape[0], dtype=torch.long)
        qweight = torch._make_per_channel_quantized_tensor(q, scales.double(), zero, 0)
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = engine
            self.packed = torch.ops.quantized.linear_prepack(
                qweight, None if bias is None else bias.float()
            )
        finally:
            torch.backends.quantized.engine = previous
        self.nbytes = q.numel() + 4 * scales.numel()
        self.input_dtype = torch.float32
        self.out_features = q.shape[0]
        # A compiled graph cannot hold the packed weight (a TorchScript object): it passes
        # this handle to chattts::int8_dynamic_linear, which looks the weight up.
        self.handle = next(_handles)
        _PACKED_INT8[self.handle] = self.packed
        self.register_buffer("handle_tensor", torch.tensor(self.handle), persistent=False)

    def __del__(self) -> None:
        _PACKED_INT8.pop(getattr(self, "handle", -1), None)

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # model/compiled_decode.py
            return torch.ops.chattts.int8_dynamic_linear(
                x.to(self.input_dtype), self.handle_tensor, self.out_features
            )
        return torch.ops.quantized.linear_dynamic(x.to(self.input_dtype), self.packed, False)


_PACKED_INT8: dict[int, object] = {}
_handles = itertools.count()


def _int8_dynamic_linear_impl(x: Tensor, handle: Tensor, out_features: int) -> Tensor:
    packed = _PACKED_INT8[int(handle)]
    return torch.ops.quantized.linear_dynamic(x, packed, False)  # type: ignore[arg-type]


def _int8_dynamic_linear_fake(x: Tensor, handle: Tensor, out_features: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


_LIBRARY.define("int8_dynamic_linear(Tensor x, Tensor handle, int out_features) -> Tensor")
_LIBRARY.impl("int8_dynamic_linear", _int8_dynamic_linear_impl, "CPU")
torch.library.register_fake("chattts::int8_dynamic_linear", _int8_dynamic_linear_fake, lib=_LIBRARY)


class WeightOnlyInt8Linear(nn.Module):
    """``torch._weight_int8pack_mm``: int8 weights per output channel, bf16 activations (its
    fp32 path is scalar and slow); dequantizes inside the kernel, bf16 out. Reads at about the
    memory bandwidth at batch 1; slow for large batches (it is a GEMV per row)."""

    weight: Tensor  # int8 (N, K)
    scales: Tensor  # bf16 (N,)
    bias: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        q, scales = _int8_per_channel(weight)
        self.register_buffer("weight", q)
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))
        self.input_dtype = torch.bfloat16

    def forward(self, x: Tensor) -> Tensor:
        y = torch._weight_int8pack_mm(x.to(self.input_dtype), self.weight, self.scales)
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class LinearMode:
    name: str
    family: str
    """'none' (lossless), 'bf16' or 'int8': what --quantize names."""
    build: Callable[[Tensor, Tensor | None], nn.Module] | None
    """Weight (N, K) and bias -> the kernel; None for a mixed mode (see ``per_layer``)."""
    why_not: Callable[[torch.device, torch.dtype, CpuFeatures], str | None]
    """Why this mode cannot serve on the device, dtype and CPU; None where it can."""
    fuse: bool = True
    """Stack projections that share an input (Q/K/V, gate/up) into one matmul."""
    per_layer: Callable[[int], str] | None = None
    """A mixed mode: layer index -> the mode whose kernel that layer runs."""

    def available(
        self, device: torch.device, dtype: torch.dtype, cpu: CpuFeatures | None = None
    ) -> bool:
        return self.why_not(device, dtype, cpu or cpu_features()) is None

    @property
    def lossless(self) -> bool:
        return self.family == "none"

    def for_layer(self, layer_id: int) -> LinearMode:
        """The mode whose kernel layer ``layer_id`` runs in this mode (itself unless mixed)."""
        return MODES[self.per_layer(layer_id)] if self.per_layer else self


MIXED = (("int8-wo", 2), ("int8-wo", 4), ("int8", 6), ("int8", 8))
"""(int8 mode, N): ``<mode>-mixedN`` keeps layers 0..N-1 in bf16 (the module doc says why);
autotune serves the fastest of them whose SNR clears the budget on the loaded weights."""


def _first_layers_bf16(num_bf16: int, base: str, layer_id: int) -> str:
    return "bf16" if layer_id < num_bf16 else base


def _why_not_cpu_fp32(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cpu":
        return "lossy linear modes are CPU-only"
    if dtype != torch.float32:
        return "lossy linear modes need an fp32 model"
    return None


def _why_not_onednn(device: torch.device, dtype: torch.dtype, cpu: CpuFeatures) -> str | None:
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return "oneDNN packing is for fp32/bf16 on CPU"
    return None if onednn_available() else "this torch build has no oneDNN linear ops"


def _why_not_bf16(device: torch.device, dtype: torch.dtype, cpu: CpuFeatures) -> str | None:
    if reason := _why_not_cpu_fp32(device, dtype) or _why_not_onednn(device, dtype, cpu):
        return reason
    if not cpu.native_bf16("onednn"):
        return "no AVX512-BF16 or AMX: oneDNN would emulate bf16 and gain nothing"
    return None


def _why_not_int8(
    engine: str, device: torch.device, dtype: torch.dtype, cpu: CpuFeatures
) -> str | None:
    if reason := _why_not_cpu_fp32(device, dtype):
        return reason
    if not _int8_engine(engine):
        return f"this torch build has no {engine} engine"
    library = "fbgemm" if engine == "fbgemm" else "onednn"
    if not cpu.vnni(library):
        return (
            f"no VNNI for {library} (avx512_vnni, avx_vnni or amx_int8): its u8 x s8 products"
            " saturate in 16-bit pairs, below the quality budget"
        )
    return None


def _why_not_int8_wo(device: torch.device, dtype: torch.dtype, cpu: CpuFeatures) -> str | None:
    if not hasattr(torch, "_weight_int8pack_mm"):
        return "this torch build has no _weight_int8pack_mm"
    return _why_not_bf16(device, dtype, cpu)  # its fp32 path is scalar: it runs in bf16


def _why_not_mixed(
    base: str, device: torch.device, dtype: torch.dtype, cpu: CpuFeatures
) -> str | None:
    return MODES["bf16"].why_not(device, dtype, cpu) or MODES[base].why_not(device, dtype, cpu)


MODES: dict[str, LinearMode] = {
    m.name: m
    for m in [
        # MKL ran the stacked Q/K/V and gate/up matrices ~10% slower than separate ones on CPU.
        LinearMode("dense", "none", DenseLinear, lambda d, t, c: None, fuse=False),
        LinearMode(
            "dense-onednn", "none", lambda w, b: OneDNNLinear(w, b, w.dtype), _why_not_onednn
        ),
        LinearMode("bf16", "bf16", lambda w, b: OneDNNLinear(w, b, torch.bfloat16), _why_not_bf16),
        LinearMode(
            "int8",
            "int8",
            lambda w, b: DynamicInt8Linear(w, b, "fbgemm"),
            functools.partial(_why_not_int8, "fbgemm"),
        ),
        LinearMode(
            "int8-onednn",
            "int8",
            lambda w, b: DynamicInt8Linear(w, b, "onednn"),
            functools.partial(_why_not_int8, "onednn"),
        ),
        LinearMode("int8-wo", "int8", WeightOnlyInt8Linear, _why_not_int8_wo),
        *(
            LinearMode(
                f"{base}-mixed{n}",
                "int8",
                None,
                functools.partial(_why_not_mixed, base),
                per_layer=functools.partial(_first_layers_bf16, n, base),
            )
            for base, n in MIXED
        ),
    ]
}


def unavailable_modes(
    quantize: str, device: torch.device, dtype: torch.dtype, cpu: CpuFeatures | None = None
) -> dict[str, str]:
    """The modes ``--quantize`` names that cannot serve here -> why (logged at warm-up)."""
    cpu = cpu or cpu_features()
    reasons = {
        m.name: m.why_not(device, dtype, cpu)
        for m in MODES.values()
        if quantize == "auto" or m.family == quantize
    }
    return {name: why for name, why in reasons.items() if why}


def log_left_out(quantize: str, device: torch.device, dtype: torch.dtype) -> None:
    """Say at start-up which modes `--quantize` names this CPU is not offered, and why."""
    left_out = unavailable_modes(quantize, device, dtype)
    if left_out:
        log.info(
            "GPT linear modes left out on %s: %s",
            cpu_features().describe(),
            "; ".join(f"{name} ({why})" for name, why in left_out.items()),
        )


def modes_for(
    quantize: str, device: torch.device, dtype: torch.dtype, cpu: CpuFeatures | None = None
) -> list[str]:
    """The modes ``--quantize`` allows on this device, dtype and CPU, lossless first."""
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
    cpu = cpu or cpu_features()
    names = [
        m.name
        for m in MODES.values()
        if (quantize == "auto" or m.family == quantize) and m.why_not(device, dtype, cpu) is None
    ]
    if not names:
        reasons = unavailable_modes(quantize, device, dtype, cpu)
        raise ValueError(
            f"--quantize {quantize} has no kernel for {device.type}/{dtype} on {cpu.describe()}: "
            + "; ".join(f"{name}: {why}" for name, why in reasons.items())
        )
    return names


def module_bytes(module: nn.Module) -> int:
    """Bytes a kernel's weights take (buffers, or the packed int8 weight)."""
    total = sum(b.numel() * b.element_size() for b in module.buffers())
    return total + int(getattr(module, "nbytes", 0))


class ModeTable:
    """Decode batch size -> linear mode. A batch of B rows uses the entry of the smallest size
    >= B (the largest size's beyond the table); autotune fills it, the decoder reads it."""

    def __init__(self, table: Mapping[int, str]) -> None:
        if not table:
            raise ValueError("a mode table needs at least one entry")
        self.table = dict(sorted(table.items()))
        sizes = list(self.table)
        self._by_rows = [
            self.table[next((b for b in sizes if b >= rows), sizes[-1])]
            for rows in range(sizes[-1] + 1)
        ]

    def mode_for(self, num_rows: int) -> str:
        return self._by_rows[min(num_rows, len(self._by_rows) - 1)]

    @property
    def largest(self) -> str:
        """The mode of the largest batch size (prefill's default)."""
        return self._by_rows[-1]
