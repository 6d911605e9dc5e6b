"""The GPT decode step on the CPU runtimes we did not ship, beside the two we did.

One decode step of ChatTTS's GPT shapes (20 layers, hidden 768, 12 heads, FFN 3072, random
weights) at batch 1, 4 and 16, each row attending to `--context` cached positions:

- torch:        our LlamaDecoder in the mode `--quantize auto` serves here (autotune's pick at
                this batch among the modes within the SNR budget), and fp32 (dense-onednn);
- llama.cpp:    the server's backend (engine/llamacpp_gpt.py), F16 and Q8_0;
- ONNX Runtime: the same step exported to ONNX (K/V as inputs), fp32, dynamic int8
                (`quantize_dynamic`) and 4-bit weights (`MatMulNBits`, block 32);
- OpenVINO:     that ONNX graph compiled by OpenVINO, fp32, and its weights compressed to int8
                and int4 by NNCF (`compress_weights`).

Each contender runs its steps back to back (their thread pools spin after a run, so turns
step by step would slow whoever comes next); every figure is printed with the load average. ONNX Runtime, OpenVINO and NNCF are not server dependencies:
`uv sync --locked --extra server --extra dev --extra bench-runtimes` installs them for this run;
without them their rows say they were skipped. Writes <out>/cpu_runtimes.md.

Usage: python bench/bench_cpu_runtimes.py [--batches 1,4,16] [--context 100] [--steps 10]
       [--out bench/results]
       python bench/bench_cpu_runtimes.py --smoke   # tiny shapes, two steps, a temp folder
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "server"), str(REPO / "client"), str(REPO / "bench")]

import _llamacpp_rows as llamacpp  # noqa: E402
from transformers import LlamaConfig, LlamaModel  # noqa: E402

from chattts_server.defaults import MIN_SNR_DB  # noqa: E402
from chattts_server.engine.backend_choice import llamacpp_unavailable  # noqa: E402
from chattts_server.model.autotune import measure_snr  # noqa: E402
from chattts_server.model.kv_cache import SlotKVCache  # noqa: E402
from chattts_server.model.linear_modes import MODES, modes_for  # noqa: E402
from chattts_server.model.llama import LlamaDecoder, LlamaShape  # noqa: E402


class DecodeStep(nn.Module):
    """transformers' Llama layers as one decode step with the cache as inputs, written as plain
    ops (RMSNorm, rotate-half rope, attention over past + new K/V, SwiGLU) so that it exports to
    ONNX as one graph: x (B, D), past K/V (layers, B, heads, T, head_dim) -> the final normed
    hidden states (B, D). Every row is at position T."""

    def __init__(self, model: LlamaModel, context: int) -> None:
        super().__init__()
        self.model = model
        config = model.config
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        )
        angles = torch.cat([context * inv_freq] * 2)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            h = self._norm(x, layer.input_layernorm.weight)
            q = self._rope(attn.q_proj(h).view(b, self.heads, 1, self.head_dim))
            k = self._rope(attn.k_proj(h).view(b, self.heads, 1, self.head_dim))
            v = attn.v_proj(h).view(b, self.heads, 1, self.head_dim)
            keys = torch.cat([past_k[i], k], dim=2)
            values = torch.cat([past_v[i], v], dim=2)
            weights = torch.softmax(q @ keys.transpose(-1, -2) / self.head_dim**0.5, dim=-1)
            x = x + attn.o_proj((weights @ values).reshape(b, -1))
            mlp = layer.mlp
            h = self._norm(x, layer.post_attention_layernorm.weight)
            x = x + mlp.down_proj(nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        return self._norm(x, self.model.norm.weight)


def _in_blocks(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms per step, each contender's steps back to back. Not interleaved step by step
    as bench_decode_step does: these runtimes keep thread pools of their own whose workers
    spin after a run, and a spinning pool slows whichever contender runs next."""
    times: dict[str, float] = {}
    for name, step in steps.items():
        step()
        step()
        ts = []
        for _ in range(repeats):
            started = time.perf_counter()
            step()
            ts.append((time.perf_counter() - started) * 1e3)
        times[name] = statistics.median(ts)
    return times


def _onnx_sessions(model: LlamaModel, shape: LlamaShape, context: int, folder: Path):  # type: ignore[no-untyped-def]
    """{name: (run(x, k, v) -> hidden)} for ONNX Runtime and OpenVINO, or why they are missing."""
    try:
        import onnx  # noqa: F401
        import onnxruntime as ort
    except ImportError as exc:
        return {}, f"ONNX Runtime skipped ({exc}; `--extra bench-runtimes` installs it)"
    step = DecodeStep(model, context).eval()
    kv = (shape.num_layers, 1, shape.num_kv_heads, context, shape.head_dim)
    example = (torch.zeros(1, shape.hidden_size), torch.zeros(kv), torch.zeros(kv))
    fp32 = folder / "step.onnx"
    with torch.inference_mode():
        torch.onnx.export(
            step,
            example,
            str(fp32),
            input_names=["x", "past_k", "past_v"],
            output_names=["hidden"],
            dynamic_axes={"x": {0: "batch"}, "past_k": {1: "batch"}, "past_v": {1: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    int8 = folder / "step-int8.onnx"
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    int4 = folder / "step-int4.onnx"
    quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32)), block_size=32, is_symmetric=True)
    quantizer.process()
    quantizer.model.save_model_to_file(str(int4), use_external_data_format=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    # Its workers spin after each run by default, starving the next contender's threads.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    runs = {}
    for name, path in (("ort-fp32", fp32), ("ort-int8", int8), ("ort-int4", int4)):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runs[name] = lambda x, k, v, s=session: s.run(None, {"past_k": k, "past_v": v, "x": x})[0]
    notes = ""
    try:
        import nncf
        import openvino as ov
    except ImportError as exc:
        notes = f"OpenVINO skipped ({exc}; `--extra bench-runtimes` installs it)"
    else:
        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": torch.get_num_threads()}
        base = ov.convert_model(str(fp32))
        runs["ov-fp32"] = _ov_run(core.compile_model(base, "CPU", config))
        for mode, label in ((nncf.CompressWeightsMode.INT8_ASYM, "ov-int8"),
                            (nncf.CompressWeightsMode.INT4_SYM, "ov-int4")):  # fmt: skip
            compressed = nncf.compress_weights(ov.convert_model(str(fp32)), mode=mode)
            runs[label] = _ov_run(core.compile_model(compressed, "CPU", config))
    return runs, notes


def _ov_run(compiled):  # type: ignore[no-untyped-def]
    request = compiled.create_infer_request()

    def run(x: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return request.infer({"x": x, "past_k": k, "past_v": v})[compiled.output(0)]

    return run


def _torch_step(
    decoder: LlamaDecoder, cache: SlotKVCache, x: torch.Tensor, context: int, mode: str
) -> Callable[[], object]:
    slots, positions = torch.arange(len(x)), torch.full((len(x),), context)
    return lambda: decoder.decode(slots, x, positions, cache, mode=mode)


def _graph_step(run: Callable[..., object], x: np.ndarray, kv: np.ndarray) -> Callable[[], object]:
    return lambda: run(x, kv, kv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, two steps, temp out")
    args = parser.parse_args()
    dims = dict(layers=20, hidden=768, heads=12, inter=3072)
    if args.smoke:
        dims = dict(layers=2, hidden=128, heads=4, inter=256)
        args.batches, args.context, args.steps = "1,2", 16, 2
        args.out = tempfile.mkdtemp(prefix="bench_cpu_runtimes-")
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    config = LlamaConfig(
        hidden_size=dims["hidden"],
        intermediate_size=dims["inter"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["heads"],
        num_hidden_layers=dims["layers"],
        max_position_embeddings=4096,
        vocab_size=8,
    )
    model = LlamaModel(config).eval()
    shape = LlamaShape.from_config(config)
    cpu, fp32 = torch.device("cpu"), torch.float32
    modes = modes_for("auto", cpu, fp32)
    decoder = LlamaDecoder.from_state_dict(config, model.state_dict(), cpu, fp32, modes=modes)
    probe = 0.02 * torch.randn(32, shape.hidden_size)
    with torch.inference_mode():
        snr = {m: v for m, v in measure_snr(decoder, probe, "dense", modes).items()}
    within = [m for m in modes if MODES[m].lossless or snr.get(m, 0) >= MIN_SNR_DB]
    cache = SlotKVCache(shape, max(batches), args.context + 2, cpu, fp32)
    folder = Path(tempfile.mkdtemp(prefix="bench-runtimes-"))
    with torch.inference_mode():
        onnx_runs, notes = _onnx_sessions(model, shape, args.context, folder)
    llama_rows = []
    missing = llamacpp_unavailable()
    if missing is None:
        reference = model(inputs_embeds=probe[None]).last_hidden_state[0].detach()
        llama_rows = llamacpp.build_rows(
            model, config, ["F16", "Q8_0"], max(batches), max(512, args.context + 2),
            torch.get_num_threads(), probe, reference,
        )  # fmt: skip
    load = os.getloadavg()[0]
    print(
        f"decode step, {dims}, context {args.context}, {torch.get_num_threads()} threads, load {load:.1f}"
    )
    results: dict[int, dict[str, float]] = {}
    for batch in batches:
        x = torch.randn(batch, shape.hidden_size)
        steps: dict[str, Callable[[], object]] = {}
        for mode in dict.fromkeys(["dense-onednn", *within]):
            if mode in modes:
                steps[f"torch {mode}"] = _torch_step(decoder, cache, x, args.context, mode)
        kv = np.zeros(
            (shape.num_layers, batch, shape.num_kv_heads, args.context, shape.head_dim), np.float32
        )
        xs = x.numpy()
        for name, run in onnx_runs.items():
            steps[name] = _graph_step(run, xs, kv)
        for row in llama_rows:
            steps[f"llama.cpp {row.weight_format}"] = llamacpp.decode_step(
                row, [args.context] * batch
            )
        with torch.inference_mode():
            results[batch] = _in_blocks(steps, args.steps)
        print(f"B{batch}: " + ", ".join(f"{n} {ms:.1f}" for n, ms in results[batch].items()))
    names = list(dict.fromkeys(n for r in results.values() for n in r))
    torch_auto = {
        b: min((n for n in r if n.startswith("torch ")), key=r.__getitem__)
        for b, r in results.items()
    }
    lines = [
        "# The GPT decode step on CPU runtimes",
        "",
        f"{dims}, context {args.context}, {torch.get_num_threads()} threads, median ms of "
        f"{args.steps}, load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the "
        f"end. Command: `python {' '.join(sys.argv)}`",
        "",
        "| runtime | " + " | ".join(f"B={b} ms" for b in batches) + " |",
        "|---" * (len(batches) + 1) + "|",
    ]
    for name in names:
        cells = " | ".join(
            f"{results[b][name]:.1f}" if name in results[b] else "-" for b in batches
        )
        lines.append(f"| {name} | {cells} |")
    lines += [
        "",
        "torch rows: fp32 (dense-onednn) and each mode within the SNR budget on these weights "
        f"({', '.join(within)}); the fastest per batch: "
        + ", ".join(f"B{b} {n}" for b, n in torch_auto.items())
        + ". llama.cpp: SNR vs fp32 "
        + ", ".join(f"{r.weight_format} {r.snr_db:.1f} dB" for r in llama_rows)
        + (f". {missing}" if missing else "")
        + (f". {notes}" if notes else "")
        + ".",
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_runtimes.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out / 'cpu_runtimes.md'}")


if __name__ == "__main__":
    main()
