"""Linear-layer kernels for the GPT's projections: the same ``x @ W.T + b`` in several formats.

A *mode* names one way to hold a weight and run the matmul. The decoder keeps the weights of
every allowed mode and picks one per decode batch size (see ``model/autotune.py``): what wins
on one CPU loses on another, so the choice is timed on the machine itself.

| mode          | weight                        | activations                         | family |
|---------------|-------------------------------|-------------------------------------|--------|
| dense         | model dtype, ``F.linear``     | model dtype                         | none   |
| dense-onednn  | model dtype, oneDNN-packed    | model dtype                         | none   |
| bf16          | bf16, oneDNN-packed (AVX512-BF16/AMX) | bf16 in, bf16 out           | bf16   |
| int8          | int8 per output channel, fbgemm | quantized per call (uint8, dynamic) | int8 |
| int8-onednn   | int8 per output channel, oneDNN | quantized per call (uint8, dynamic) | int8 |
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

``--quantize`` names the families allowed: ``none`` (lossless), ``bf16``, ``int8``, or ``auto``
(every family, each lossy mode only if it keeps the hidden state within the quality budget).
Lossy modes exist only on CPU with an fp32 model: the residual stream, norms and rotary stay
fp32; the matmul inputs and weights change format (and the KV cache is bf16 where bf16 is fast,
see ``LlamaDecoder.from_state_dict``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .quantize_policy import QUANTIZE_CHOICES

# Batch size oneDNN packs the weights for; measured to matter little between 1 and 64.
_ONEDNN_BATCH_HINT = 16


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN linear ops used for packed weights."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def _bf16_fast() -> bool:
    # oneDNN runs bf16 matmuls natively with AMX or AVX512-BF16; elsewhere it emulates them.
    return onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


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

    The packed weight belongs to the quantized engine it was packed under (fbgemm: AVX2/AVX512
    kernels; onednn: VNNI/AMX int8). ``reduce_range`` (7-bit activations) avoids the int16
    overflow of fbgemm's pre-VNNI kernels; with VNNI the full 8 bits are safe and 4 dB better.
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
        vnni = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())
        self.reduce_range = engine == "fbgemm" and not vnni
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
                x.to(self.input_dtype), self.handle_tensor, self.out_features, self.reduce_range
            )
        return torch.ops.quantized.linear_dynamic(
            x.to(self.input_dtype), self.packed, self.reduce_range
        )


_PACKED_INT8: dict[int, object] = {}
_handles = itertools.count()


def _int8_dynamic_linear_impl(
    x: Tensor, handle: Tensor, out_features: int, reduce_range: bool
) -> Tensor:
    packed = _PACKED_INT8[int(handle)]
    return torch.ops.quantized.linear_dynamic(x, packed, reduce_range)  # type: ignore[arg-type]


def _int8_dynamic_linear_fake(
    x: Tensor, handle: Tensor, out_features: int, reduce_range: bool
) -> Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


_LIBRARY.define(
    "int8_dynamic_linear(Tensor x, Tensor handle, int out_features, bool reduce_range) -> Tensor"
)
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
    available: Callable[[torch.device, torch.dtype], bool]
    fuse: bool = True
    """Stack projections that share an input (Q/K/V, gate/up) into one matmul."""
    per_layer: Callable[[int], str] | None = None
    """A mixed mode: layer index -> the mode whose kernel that layer runs."""

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


def _mixed_available(base: str, device: torch.device, dtype: torch.dtype) -> bool:
    return MODES["bf16"].available(device, dtype) and MODES[base].available(device, dtype)


def _cpu_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32


MODES: dict[str, LinearMode] = {
    m.name: m
    for m in [
        # MKL ran the stacked Q/K/V and gate/up matrices ~10% slower than separate ones on CPU.
        LinearMode("dense", "none", DenseLinear, lambda d, t: True, fuse=False),
        LinearMode(
            "dense-onednn",
            "none",
            lambda w, b: OneDNNLinear(w, b, w.dtype),
            lambda d, t: (
                d.type == "cpu" and t in (torch.float32, torch.bfloat16) and onednn_available()
            ),
        ),
        LinearMode(
            "bf16",
            "bf16",
            lambda w, b: OneDNNLinear(w, b, torch.bfloat16),
            lambda d, t: _cpu_fp32(d, t) and _bf16_fast(),
        ),
        LinearMode(
            "int8",
            "int8",
            lambda w, b: DynamicInt8Linear(w, b, "fbgemm"),
            lambda d, t: _cpu_fp32(d, t) and _int8_engine("fbgemm"),
        ),
        LinearMode(
            "int8-onednn",
            "int8",
            lambda w, b: DynamicInt8Linear(w, b, "onednn"),
            lambda d, t: _cpu_fp32(d, t) and _int8_engine("onednn"),
        ),
        LinearMode(
            "int8-wo",
            "int8",
            WeightOnlyInt8Linear,
            lambda d, t: _cpu_fp32(d, t) and hasattr(torch, "_weight_int8pack_mm") and _bf16_fast(),
        ),
        *(
            LinearMode(
                f"{base}-mixed{n}",
                "int8",
                None,
                functools.partial(_mixed_available, base),
                per_layer=functools.partial(_first_layers_bf16, n, base),
            )
            for base, n in MIXED
        ),
    ]
}


def modes_for(quantize: str, device: torch.device, dtype: torch.dtype) -> list[str]:
    """The modes ``--quantize`` allows on this device and dtype, lossless first."""
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
    names = [
        m.name
        for m in MODES.values()
        if m.available(device, dtype) and (quantize == "auto" or m.family == quantize)
    ]
    if not names:
        raise ValueError(f"--quantize {quantize} has no kernel for {device.type}/{dtype}")
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
