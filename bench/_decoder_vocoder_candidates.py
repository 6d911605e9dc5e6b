"""Ways to compute the ChatTTS Decoder and Vocos on a CPU, for bench/bench_decoder_vocoder.py.

Each candidate turns deep copies of the fp32 Decoder and Vocos into modules that the server's
streaming path (`StreamingDecoder`, `VocosVocoder`, `StreamingStack`) runs unchanged: only the
pointwise MLP of each ConvNeXt block (LayerNorm, pwconv1, GELU, pwconv2; 12 Decoder blocks at
512 -> 2048 -> 512, 8 Vocos blocks at 512 -> 1536 -> 512, about 95% of the FLOPs) changes. The
depthwise and plain convolutions, the Vocos head's Linear (its phase output is the most sensitive
layer) and the iSTFT stay torch fp32 everywhere, so the rows differ only where they say.

A fused MLP (ONNX Runtime, ggml) takes the block's `norm` slot and the block's `pwconv1`, `act`
and `pwconv2` become identities: `StreamingStack` (`Stage.mix`) and the offline forward of both
ChatTTS's and Vocos's blocks call those four in that order, so both paths see the same module.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import io
import logging
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Modules = tuple[nn.Module, nn.Module]  # (Decoder, Vocos)


def blocks(decoder: nn.Module, vocos: nn.Module, which: str = "both") -> list[Any]:
    """The ConvNeXt blocks of the Decoder and/or Vocos (untyped upstream modules)."""
    found: list[Any] = []
    if which in ("both", "decoder"):
        found += list(decoder.decoder.decoder_block)  # type: ignore[union-attr]
    if which in ("both", "vocos"):
        found += list(vocos.backbone.convnext)  # type: ignore[union-attr]
    return found


# -- torch: bf16 and int8 Linear layers ------------------------------------------------------


class Bf16Linear(nn.Module):
    """A Linear with bf16 weights: input rounded to bf16, bf16 GEMM (oneDNN), fp32 out."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        # Buffers, not parameters: callers read a module's dtype from its first parameter.
        self.register_buffer("weight", linear.weight.detach().bfloat16())
        assert linear.bias is not None
        self.register_buffer("bias", linear.bias.detach().bfloat16())

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x.bfloat16(), self.weight, self.bias).float()


class Int8RowLinear(nn.Module):
    """A Linear in int8 with one activation scale per frame (row) and one weight scale per
    output channel: rows never share a scale, and the int32 accumulation is exact, so a frame's
    output does not depend on which other frames (streams, chunks) share the call.

    Weights use 7 bits (+-63): u8 x s8 pair sums of AVX2's vpmaddubsw (which oneDNN uses for s8
    sources on CPUs without VNNI, adding 128 to the activations) stay below int16's limit.
    """

    WEIGHT_MAX = 63.0

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / self.WEIGHT_MAX
        self.register_buffer("w_t", torch.round(w / scale[:, None]).to(torch.int8).T)  # (in, out)
        self.register_buffer("w_scale", scale)
        assert linear.bias is not None
        self.register_buffer("bias", linear.bias.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0  # (rows, 1)
        xq = torch.round(x2 / x_scale).to(torch.int8)
        acc = torch._int_mm(xq, self.w_t)  # (rows, out) int32, exact
        y = torch.addcmul(self.bias, acc.float() * x_scale, self.w_scale)
        return y.reshape(*shape[:-1], y.shape[-1])


def swap_linears(factory: Callable[[nn.Linear], nn.Module], which: str = "both") -> Callable:
    def build(decoder: nn.Module, vocos: nn.Module) -> Modules:
        for block in blocks(decoder, vocos, which):
            block.pwconv1 = factory(block.pwconv1)
            block.pwconv2 = factory(block.pwconv2)
        return decoder, vocos

    return build


def int8_dynamic(decoder: nn.Module, vocos: nn.Module) -> Modules:
    """torch.ao's dynamic int8 Linear (fbgemm on x86): per-channel int8 weights, activations
    quantized per call with one scale for the whole (packed) input, 7-bit (reduce_range)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao.quantization, gone in 2.10
        for block in blocks(decoder, vocos):
            quantize_dynamic(
                block, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
            )
    return decoder, vocos


# -- fused MLPs: ONNX Runtime, ggml ----------------------------------------------------------


def fuse_mlps(make: Callable[[Any], nn.Module]) -> Callable:
    def build(decoder: nn.Module, vocos: nn.Module) -> Modules:
        for block in blocks(decoder, vocos):
            mlp = make(block)
            block.norm = mlp
            block.pwconv1, block.act, block.pwconv2 = nn.Identity(), nn.Identity(), nn.Identity()
        return decoder, vocos

    return build


def _mlp(block: Any) -> nn.Module:
    return nn.Sequential(block.norm, block.pwconv1, nn.GELU(), block.pwconv2).eval()


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime.quantization logs a pre-processing hint per model on the root logger."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


class OrtMLP(nn.Module):
    """A block's MLP as one ONNX Runtime session over (frames, C) rows."""

    def __init__(self, block: Any, int8: bool, threads: int) -> None:
        super().__init__()
        import onnxruntime as ort

        mlp = _mlp(block)
        width = block.pwconv1.in_features
        buf = io.BytesIO()
        torch.onnx.export(
            mlp,
            (torch.randn(4, width),),
            buf,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
            opset_version=17,
        )
        model = buf.getvalue()
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # Per-channel int8 weights, 7-bit (reduce_range: MLAS's AVX2 u8 x s8 kernel cannot
            # saturate), activations per call with one scale for the whole input (as torch.ao).
            with tempfile.TemporaryDirectory() as tmp, _quiet_root_logger():
                src, dst = Path(tmp, "fp32.onnx"), Path(tmp, "int8.onnx")
                src.write_bytes(model)
                quantize_dynamic(
                    src, dst, per_channel=True, reduce_range=True, weight_type=QuantType.QInt8
                )
                model = dst.read_bytes()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # No spinning between calls: the engine thread does other work in between, and spinning
        # pools starve a neighbour on a shared CPU (server/chattts_server/threads.py).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.width = width

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.width).float().contiguous().numpy()
        (y,) = self.session.run(None, {"x": rows})
        return torch.from_numpy(y).reshape(x.shape)


class _Ggml:
    """The few ggml C functions a fused MLP needs, from llama-cpp-python's bundled libggml."""

    F32, Q8_0 = 0, 8

    class InitParams(ctypes.Structure):
        _fields_ = [
            ("mem_size", ctypes.c_size_t),
            ("mem_buffer", ctypes.c_void_p),
            ("no_alloc", ctypes.c_bool),
        ]

    def __init__(self) -> None:
        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib"
        base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        p, i64, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t

        def fn(lib: ctypes.CDLL, name: str, res: Any, *args: Any) -> Any:
            f = getattr(lib, name)
            f.restype, f.argtypes = res, list(args)
            return f

        self.init = fn(base, "ggml_init", p, self.InitParams)
        self.free = fn(base, "ggml_free", None, p)
        self.new_1d = fn(base, "ggml_new_tensor_1d", p, p, ctypes.c_int, i64)
        self.new_2d = fn(base, "ggml_new_tensor_2d", p, p, ctypes.c_int, i64, i64)
        self.data = fn(base, "ggml_get_data", p, p)
        self.nbytes = fn(base, "ggml_nbytes", size, p)
        self.norm = fn(base, "ggml_norm", p, p, p, ctypes.c_float)
        self.mul = fn(base, "ggml_mul", p, p, p, p)
        self.add = fn(base, "ggml_add", p, p, p, p)
        self.mul_mat = fn(base, "ggml_mul_mat", p, p, p, p)
        self.gelu_erf = fn(base, "ggml_gelu_erf", p, p, p)
        self.new_graph = fn(base, "ggml_new_graph", p, p)
        self.expand = fn(base, "ggml_build_forward_expand", None, p, p)
        self.tensor_overhead = fn(base, "ggml_tensor_overhead", size)()
        self.graph_overhead = fn(base, "ggml_graph_overhead", size)()
        self.quantize = fn(base, "ggml_quantize_chunk", size, ctypes.c_int, p, p, i64, i64, i64, p)
        self.compute = fn(cpu, "ggml_graph_compute_with_ctx", ctypes.c_int, p, p, ctypes.c_int)
        fn(cpu, "ggml_cpu_init", None)()


_GGML: _Ggml | None = None


def ggml() -> _Ggml:
    global _GGML
    if _GGML is None:
        _GGML = _Ggml()
    return _GGML


class GgmlMLP(nn.Module):
    """A block's MLP as a ggml graph (llama.cpp's kernels), weights in Q8_0 or F32: Q8_0
    quantizes activations per block of 32 values of one row, so rows never share a scale."""

    def __init__(self, block: Any, wtype: int, threads: int) -> None:
        super().__init__()
        g = self.g = ggml()
        self.threads = threads
        norm, pw1, pw2 = block.norm, block.pwconv1, block.pwconv2
        self.k, self.h, self.eps = pw1.in_features, pw1.out_features, float(norm.eps)
        vectors = {"ln_w": norm.weight, "ln_b": norm.bias, "b1": pw1.bias, "b2": pw2.bias}
        size = 2 * self.k * self.h * 4 + 16 * g.tensor_overhead + 4 * (3 * self.k + self.h) + 4096
        self.ctx = g.init(g.InitParams(size, None, False))
        self.t: dict[str, int] = {}
        for name, v in vectors.items():
            t = g.new_1d(self.ctx, g.F32, v.numel())
            ctypes.memmove(g.data(t), v.detach().float().contiguous().data_ptr(), g.nbytes(t))
            self.t[name] = t
        for name, linear in (("w1", pw1), ("w2", pw2)):
            w = linear.weight.detach().float().contiguous()  # (out, in): ggml's (ne0=in, ne1=out)
            t = g.new_2d(self.ctx, wtype, w.shape[1], w.shape[0])
            if wtype == g.F32:
                ctypes.memmove(g.data(t), w.data_ptr(), g.nbytes(t))
            else:
                g.quantize(wtype, w.data_ptr(), g.data(t), 0, w.shape[0], w.shape[1], None)
            self.t[name] = t
        self.scratch = torch.empty(0, dtype=torch.uint8)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.g.free(self.ctx)

    def forward(self, x: Tensor) -> Tensor:
        g, t = self.g, self.t
        rows = x.reshape(-1, self.k).float().contiguous()
        m = rows.shape[0]
        need = 4 * m * (6 * self.k + 3 * self.h) + 2 * m * (self.k + self.h)
        need += 32 * g.tensor_overhead + g.graph_overhead + (1 << 20)
        if self.scratch.numel() < need:
            self.scratch = torch.empty(need, dtype=torch.uint8)
        ctx = g.init(g.InitParams(need, self.scratch.data_ptr(), False))
        try:
            xin = g.new_2d(ctx, g.F32, self.k, m)
            ctypes.memmove(g.data(xin), rows.data_ptr(), g.nbytes(xin))
            y = g.add(ctx, g.mul(ctx, g.norm(ctx, xin, self.eps), t["ln_w"]), t["ln_b"])
            y = g.gelu_erf(ctx, g.add(ctx, g.mul_mat(ctx, t["w1"], y), t["b1"]))
            y = g.add(ctx, g.mul_mat(ctx, t["w2"], y), t["b2"])
            graph = g.new_graph(ctx)
            g.expand(graph, y)
            if g.compute(ctx, graph, self.threads) != 0:
                raise RuntimeError("ggml_graph_compute failed")
            out = torch.empty((m, self.k))
            ctypes.memmove(out.data_ptr(), g.data(y), g.nbytes(y))
        finally:
            g.free(ctx)
        return out.reshape(x.shape)


# -- the candidates --------------------------------------------------------------------------


@dataclass
class Candidate:
    name: str
    what: str  # one line for the table
    build: Callable[[nn.Module, nn.Module], Modules]  # edits the deep copies it is given
    threads: int | None = None  # torch intra-op threads while it runs; None: the bench's
    flags: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    needs: str = ""  # a module it imports; the row is skipped when that is missing

    def modules(self, decoder: nn.Module, vocos: nn.Module) -> Modules:
        return self.build(copy.deepcopy(decoder), copy.deepcopy(vocos))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Its thread count and backend flags, for the duration of a run."""
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with self.flags() if self.flags else contextlib.nullcontext():
                yield
        finally:
            torch.set_num_threads(before)


@contextlib.contextmanager
def onednn_bf16() -> Iterator[None]:
    """fp32 modules, but oneDNN may compute fp32 matmuls and convolutions in bf16."""
    mm, conv = torch.backends.mkldnn.matmul, torch.backends.mkldnn.conv
    before = mm.fp32_precision, conv.fp32_precision
    mm.fp32_precision = conv.fp32_precision = "bf16"
    try:
        yield
    finally:
        mm.fp32_precision, conv.fp32_precision = before


def _unchanged(decoder: nn.Module, vocos: nn.Module) -> Modules:
    return decoder, vocos


def candidates(threads: int) -> list[Candidate]:
    """Every candidate, fp32 (the reference) first."""
    return [
        Candidate("fp32", "torch fp32, as the server runs today", _unchanged),
        Candidate("fp32-1thread", "torch fp32 on 1 intra-op thread", _unchanged, threads=1),
        Candidate(
            "onednn-bf16",
            "torch fp32 modules, oneDNN fp32_precision=bf16 (implicit bf16 matmul/conv)",
            _unchanged,
            flags=onednn_bf16,
        ),
        Candidate(
            "bf16-decoder",
            "Decoder pointwise weights in bf16, Vocos fp32",
            swap_linears(Bf16Linear, "decoder"),
        ),
        Candidate("bf16", "Decoder and Vocos pointwise weights in bf16", swap_linears(Bf16Linear)),
        Candidate(
            "int8-dynamic",
            "torch.ao quantize_dynamic (fbgemm): int8 per-channel weights, one 7-bit "
            "activation scale per call",
            int8_dynamic,
        ),
        Candidate(
            "int8-row",
            "torch._int_mm (oneDNN): 7-bit per-channel weights, one 8-bit activation scale "
            "per frame",
            swap_linears(Int8RowLinear),
        ),
        Candidate(
            "ort-fp32",
            "ONNX Runtime fp32 MLPs (LayerNorm+pwconv1+GELU+pwconv2 per block)",
            fuse_mlps(lambda b: OrtMLP(b, int8=False, threads=threads)),
            needs="onnxruntime",
        ),
        Candidate(
            "ort-int8",
            "ONNX Runtime dynamic int8 MLPs: 7-bit per-channel weights, one activation "
            "scale per call",
            fuse_mlps(lambda b: OrtMLP(b, int8=True, threads=threads)),
            needs="onnxruntime",
        ),
        Candidate(
            "ggml-q8_0",
            "ggml (llama.cpp's, already a server dependency) Q8_0 MLPs: activations per 32 values",
            fuse_mlps(lambda b: GgmlMLP(b, _Ggml.Q8_0, threads)),
            needs="llama_cpp",
        ),
    ]
