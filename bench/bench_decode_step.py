"""Time one decode step: transformers LlamaModel + DynamicCache vs our LlamaDecoder.decode in
each linear mode (model/linear_modes.py).

Random weights at ChatTTS's GPT shapes (timings do not depend on weight values), fp32 on CPU
unless --device says otherwise. The contenders run in turn, step by step, so that load from
other processes hits them alike; the header prints the load average. For each batch size B:

- bare:      LlamaModel(inputs_embeds=(B, 1, D), past_key_values=DynamicCache of `context`
             tokens), all rows the same length (no padding mask: transformers' cheapest case).
- <mode>:    LlamaDecoder.decode with that linear mode, B slots packed at ids 0..B-1
             (attention over a cache view), rows at mixed positions around `context`. K/V as
             the server keeps them (--kv-dtype served): bf16 for lossy modes when the CPU has
             fast bf16, else the model dtype.
- scattered: slot ids 0, 2, 4, ... (first mode): attention over the slot range, queries
             scattered into it.
- gathered:  slot ids 0, 3, 6, ... (first mode): the range is over 2B, so K/V are gathered.
- llamacpp-<format>: the server's llama.cpp backend (engine/llamacpp_gpt.py) on the same
             weights exported to GGUF in that format, B sequences at the same positions; its
             SNR against fp32 is printed with the weights, and after the table each format's
             FLOP rate at the largest batch beside the rate of a 512-token prefill (bench/
             _llamacpp_rows.py). Skipped, saying why, where llama.cpp does not load.
- <mode>+c:  with --compile, that mode's step as one torch.compile graph
             (model/compiled_decode.py), for each mode whose kernels trace; the seconds each
             graph took to compile (or load from inductor's cache) are printed first.

Each mode's step is also printed as a multiple of its memory floor: the bytes a step must read
(that mode's linear weights plus the live K/V of every row, positions 0..pos in the cache's
dtype) over this machine's read bandwidth, measured by a probe (an fp32 sum over a --probe-mib
buffer, far larger than the last-level cache) run in turn with the steps, on the same threads.
'auto' is the fastest mode whose hidden-state SNR on these weights (autotune's check: one
32-token prefill of embedding-scale inputs against fp32) clears the `--quantize auto` budget.

With --markdown PATH the table is also written as Markdown (per-mode ms and multiple of the
floor, speed-up vs fp32 'dense-onednn', the server's default before autotune).

Usage: python bench/bench_decode_step.py [--layers 20 --hidden 768 --heads 12 --inter 3072]
       [--batches 1,2,4,8,16] [--context 100] [--steps 10] [--modes dense,dense-onednn,...]
       [--layouts scattered,gathered] [--probe-mib 512] [--stat median|min] [--compile]
       [--markdown bench/results/decode_step.md]
       python bench/bench_decode_step.py --smoke    # tiny shapes, two steps, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import _llamacpp_rows as llamacpp
import torch
from transformers import DynamicCache, LlamaConfig, LlamaModel

from chattts_server.defaults import MIN_SNR_DB
from chattts_server.engine.backend_choice import llamacpp_unavailable
from chattts_server.model.autotune import measure_snr
from chattts_server.model.compiled_decode import CompiledDecode, compilable
from chattts_server.model.kv_cache import SlotKVCache
from chattts_server.model.linear_modes import MODES, modes_for
from chattts_server.model.llama import LlamaDecoder, LlamaShape, served_kv_dtype
from chattts_server.threads import cpu_budget, plan_threads

PROBE = "probe"
STATS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}


def _interleaved_ms(
    steps_by_name: dict[str, Callable[[], object]],
    steps: int,
    device: torch.device,
    stat: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Median (or `stat`) ms per call, calling the contenders in turn so that load on a shared
    machine hits them alike."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for step in steps_by_name.values():
        for _ in range(2):
            step()
    sync()
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for _ in range(steps):
        for name, step in steps_by_name.items():
            t0 = time.perf_counter()
            step()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: stat(ts) for name, ts in times.items()}


def _bare_step(model: LlamaModel, batch: int, context: int) -> Callable[[], object]:
    device, dtype = model.device, model.dtype
    hidden = model.config.hidden_size
    past = DynamicCache()
    model(
        inputs_embeds=torch.randn(batch, context, hidden, device=device, dtype=dtype),
        past_key_values=past,
        use_cache=True,
    )
    x = torch.randn(batch, 1, hidden, device=device, dtype=dtype)

    def step() -> None:
        model(inputs_embeds=x, past_key_values=past, use_cache=True)
        past.crop(context)  # keep the context steady across timed steps

    return step


def _positions(batch: int, context: int) -> list[int]:
    # Mixed positions within about +/-10% of context, as rows that joined at different times.
    spread = max(1, context // 10)
    return [context - spread + (7 * i) % (2 * spread + 1) for i in range(batch)]


def _probe(mib: int, device: torch.device) -> tuple[Callable[[], object], int]:
    """A read of `mib` MiB (fp32 sum; the fastest read torch has) and its byte count."""
    buf = torch.ones(mib * 2**20 // 4, device=device)
    return (lambda: buf.sum()), buf.numel() * 4


def _step_bytes(
    decoder: LlamaDecoder, mode: str, cache: SlotKVCache, batch: int, context: int
) -> int:
    """What one decode step must read: the mode's linear weights and each row's live K/V."""
    s = decoder.shape
    per_token = s.num_layers * 2 * s.num_kv_heads * s.head_dim * cache.kv.element_size()
    live = sum(p + 1 for p in _positions(batch, context)) * per_token
    return decoder.weight_bytes(mode) + live


def _ours_step(
    decoder: LlamaDecoder,
    cache: SlotKVCache,
    slot_ids: list[int],
    context: int,
    mode: str | None = None,
) -> Callable[[], object]:
    device = cache.kv.device
    batch = len(slot_ids)
    positions = torch.tensor(_positions(batch, context), device=device)
    slots = torch.tensor(slot_ids, device=device)
    x = torch.randn(batch, decoder.shape.hidden_size, device=device, dtype=decoder.norm.dtype)
    return lambda: decoder.decode(slots, x, positions, cache, mode=mode)


def _compiled_step(
    compiled: CompiledDecode, cache: SlotKVCache, batch: int, context: int, mode: str
) -> Callable[[], object]:
    """As `_ours_step` (slots 0..B-1), through the compiled decode step."""
    device = cache.kv.device
    positions = torch.tensor(_positions(batch, context), device=device)
    slots = torch.arange(batch, device=device)
    decoder = compiled.decoder
    x = torch.randn(batch, decoder.shape.hidden_size, device=device, dtype=decoder.norm.dtype)
    return lambda: compiled.run(slots, x, positions, cache, mode)


def _llama_rows(
    args: argparse.Namespace,
    model: LlamaModel,
    config: LlamaConfig,
    slots: int,
    max_tokens: int,
    probe: torch.Tensor,
) -> list[llamacpp.LlamaCppRow]:
    formats = [f for f in args.gguf_formats.split(",") if f]
    if not formats or args.device != "cpu":
        return []
    missing = llamacpp_unavailable()
    if missing is not None:
        print(f"llama.cpp rows skipped: {missing}")
        return []
    with torch.inference_mode():
        reference = model(inputs_embeds=probe[None].float()).last_hidden_state[0]
    max_tokens = max(max_tokens, llamacpp.PREFILL_TOKENS + 1)
    rows = llamacpp.build_rows(
        model, config, formats, slots, max_tokens, args.threads, probe.float(), reference
    )
    print(
        "llama.cpp GGUF MiB (hidden SNR dB vs fp32): "
        + ", ".join(
            f"{r.weight_format} {r.weight_bytes / 2**20:.0f} ({r.snr_db:.1f})" for r in rows
        )
    )
    return rows


def _flop_rates(
    rows: list[llamacpp.LlamaCppRow],
    shape: LlamaShape,
    table: list[tuple[int, dict[str, float], dict[str, float], float]],
) -> list[str]:
    """Per format: the largest batch's decode FLOP rate beside a 512-token prefill's."""
    if not rows or not table:
        return []
    batch, ms, _, _ = table[-1]
    per_token = llamacpp.linear_flops_per_token(shape)
    lines = []
    for row in rows:
        prefill = llamacpp.prefill_gflops(row, shape)
        decode = per_token * batch / ms[f"llamacpp-{row.weight_format}"] / 1e6
        lines.append(
            f"llamacpp-{row.weight_format}: batch {batch} step {decode:.1f} GFLOP/s, "
            f"{llamacpp.PREFILL_TOKENS}-token prefill {prefill:.1f} GFLOP/s "
            f"({100 * decode / prefill:.0f}% of it), load average {os.getloadavg()[0]:.1f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--inter", type=int, default=3072)
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell (median)")
    parser.add_argument(
        "--stat",
        default="median",
        choices=["median", "min"],
        help="per cell: median, or min (nearer the unloaded speed on a busy machine)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (default: what the server would use: --threads, OMP_NUM_THREADS "
        "or the CPU budget)",
    )
    parser.add_argument(
        "--probe-mib", type=int, default=512, help="bandwidth probe buffer (MiB, >> LLC)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--modes", default="", help="linear modes to time (default: every one available)"
    )
    parser.add_argument(
        "--layouts",
        default="",
        help="extra columns (first mode): scattered, gathered (empty for none)",
    )
    parser.add_argument(
        "--gguf-formats",
        default="F32,F16,Q8_0,Q6_K,Q5_K,Q4_K",
        help="llama.cpp rows, one per GGUF format (empty for none)",
    )
    parser.add_argument("--markdown", default="", help="also write the table here")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time each traceable mode's step compiled (column <mode>+c)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes, batches 1,2, two steps, no markdown"
    )
    parser.add_argument(
        "--kv-dtype",
        default="served",
        choices=["served", "float32", "bfloat16"],
        help="K/V cache dtype: as the server keeps it per mode, or one for all (default: served)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.layers, args.hidden, args.heads, args.inter = 2, 128, 4, 256
        args.batches, args.context, args.steps, args.markdown = "1,2", 16, 2, ""
        args.probe_mib, args.gguf_formats = 64, "F16"

    args.threads = args.threads or plan_threads(None, cpu_budget(), dict(os.environ)).intra_op
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    extra = [name for name in args.layouts.split(",") if name]
    config = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.inter,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        num_hidden_layers=args.layers,
        max_position_embeddings=4096,
        vocab_size=8,  # embed_tokens is unused: ChatTTS feeds inputs_embeds
    )
    model = LlamaModel(config).to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
    modes = args.modes.split(",") if args.modes else modes_for("auto", device, dtype)
    decoder = LlamaDecoder.from_state_dict(config, model.state_dict(), device, dtype, modes=modes)
    # Slot ids each column uses for batch b: modes 0..b-1, scattered every 2nd, gathered every
    # 3rd (a range over 2b, so decode gathers rows).
    spacing = {"scattered": 2, "gathered": 3}
    max_tokens = args.context + args.context // 10 + 2
    num_slots = max([1, *(spacing[n] for n in extra)]) * (max(batches) - 1) + 1
    shape = LlamaShape.from_config(config)
    caches: dict[torch.dtype, SlotKVCache] = {}

    def kv_dtype_for(mode: str) -> torch.dtype:
        if args.kv_dtype != "served":
            return getattr(torch, args.kv_dtype)  # type: ignore[no-any-return]
        return served_kv_dtype(shape, device, dtype, not MODES[mode].lossless)

    def cache_for(mode: str) -> SlotKVCache:
        kv = kv_dtype_for(mode)
        if kv not in caches:
            caches[kv] = SlotKVCache(shape, num_slots, max_tokens, device, kv)
        return caches[kv]

    # Autotune's quality check per lossy mode (each with the K/V dtype it is served with).
    # At the scale of ChatTTS's text embeddings (normal 0.02): unit-scale inputs swamp the
    # layers' contributions and read ~9 dB better than the real prompt does.
    probe_embeds = 0.02 * torch.randn(32, args.hidden, device=device, dtype=dtype)
    reference = next((m for m in modes if MODES[m].lossless), "")
    snr: dict[str, float] = {}
    with torch.inference_mode():
        for name in modes if reference else []:
            decoder.kv_dtype = kv_dtype_for(name)
            snr |= measure_snr(decoder, probe_embeds, reference, [name])
    within = [m for m in modes if snr.get(m, float("inf")) >= MIN_SNR_DB]
    probe_step, probe_bytes = _probe(args.probe_mib, device)
    llama_rows = _llama_rows(args, model, config, max(batches), max_tokens, probe_embeds)

    header = (
        f"decode step, {args.layers} layers hidden {args.hidden} heads {args.heads} "
        f"inter {args.inter}, context {args.context}, {args.dtype} on {device}, "
        f"{args.threads} threads, K/V {args.kv_dtype} "
        f"({', '.join(sorted({str(kv_dtype_for(m)).removeprefix('torch.') for m in modes}))}), "
        f"{args.stat} ms of {args.steps}, load average {os.getloadavg()[0]:.1f}"
    )
    print(header)
    weights = ", ".join(f"{m} {decoder.weight_bytes(m) / 2**20:.0f}" for m in modes)
    print(f"linear weights MiB: {weights}")
    if snr:
        print(
            f"hidden SNR dB (budget {MIN_SNR_DB:g}): "
            + ", ".join(f"{m} {v:.1f}" for m, v in snr.items())
        )
    compiled = CompiledDecode(decoder) if args.compile else None
    traced = [m for m in modes if compilable(decoder, m)] if compiled is not None else []
    names = ["bare", *modes, *extra, *(f"{m}+c" for m in traced)]
    names += [f"llamacpp-{r.weight_format}" for r in llama_rows]
    if compiled is not None:
        with torch.inference_mode():
            seconds = {
                (m, b): compiled.compile_for(cache_for(m), b, m)
                for m in traced
                for b in sorted({min(batches), max(batches)})
            }
        print(
            "compile s (mode, batch): "
            + ", ".join(f"{m} B{b} {sec:.1f}" for (m, b), sec in seconds.items())
        )
    print(" ".join(f"{n:>12}" for n in ["B", *names, "auto", "GB/s"]))
    rows: list[tuple[int, dict[str, float], dict[str, float], float]] = []
    with torch.inference_mode():
        for batch in batches:
            steps = {PROBE: probe_step, "bare": _bare_step(model, batch, args.context)}
            for name in modes:
                steps[name] = _ours_step(
                    decoder, cache_for(name), list(range(batch)), args.context, name
                )
            for name in extra:
                slot_ids = list(range(0, spacing[name] * batch, spacing[name]))
                steps[name] = _ours_step(
                    decoder, cache_for(modes[0]), slot_ids, args.context, modes[0]
                )
            for name in traced:
                steps[f"{name}+c"] = _compiled_step(
                    cast("CompiledDecode", compiled), cache_for(name), batch, args.context, name
                )
            positions = _positions(batch, args.context)
            for row in llama_rows:
                steps[f"llamacpp-{row.weight_format}"] = llamacpp.decode_step(row, positions)
            ms = _interleaved_ms(steps, args.steps, device, STATS[args.stat])
            gbs = probe_bytes / ms[PROBE] / 1e6
            floor = {
                m: _step_bytes(decoder, m, cache_for(m), batch, args.context) / gbs / 1e6
                for m in modes
            }
            floor |= {f"{m}+c": floor[m] for m in traced}
            live = sum(p + 1 for p in positions)
            floor |= {
                f"llamacpp-{r.weight_format}": (r.weight_bytes + live * r.kv_bytes_per_token)
                / gbs
                / 1e6
                for r in llama_rows
            }
            rows.append((batch, ms, floor, gbs))
            auto = min(within, key=ms.__getitem__) if within else "-"
            cells = [
                f"{ms[n]:.1f}" + (f" ({ms[n] / floor[n]:.1f}x)" if n in floor else "")
                for n in names
            ]
            print(
                f"{batch:>12} " + " ".join(f"{c:>12}" for c in cells) + f" {auto:>12} {gbs:>6.1f}",
                flush=True,
            )
    flop_lines = _flop_rates(llama_rows, LlamaShape.from_config(config), rows)
    for line in flop_lines:
        print(line)
    if args.markdown:
        base = "dense-onednn" if "dense-onednn" in modes else modes[0]
        snr_line = ", ".join(f"{m} {v:.1f}" for m, v in snr.items())
        lines = [
            f"# Decode step per linear mode\n\n{header}.\n\nCommand: `python {' '.join(sys.argv)}`",
            "",
            f"Each cell: {args.stat} ms per step (multiple of its floor: the mode's linear weights plus "
            "the rows' live K/V, over the probe's read bandwidth, GB/s column). Linear weights "
            f"MiB: {weights}. Hidden SNR dB (budget {MIN_SNR_DB:g}): {snr_line or 'not measured'}"
            "; 'auto' is the fastest mode within it.",
            "",
            "| batch | "
            + " | ".join(f"{n} ms" for n in names)
            + f" | GB/s | fastest | vs {base} | auto | auto floor ms |",
            "|---" * (len(names) + 6) + "|",
        ]
        for batch, ms, floor, gbs in rows:
            best = min(modes, key=ms.__getitem__)
            auto = min(within, key=ms.__getitem__) if within else ""
            cells = [
                f"{ms[n]:.1f}" + (f" ({ms[n] / floor[n]:.1f}x)" if n in floor else "")
                for n in names
            ]
            auto_cells = (
                f"{auto} ({ms[auto] / floor[auto]:.1f}x) | {floor[auto]:.1f}" if auto else "- | -"
            )
            lines.append(
                f"| {batch} | "
                + " | ".join(cells)
                + f" | {gbs:.1f} | {best} | {ms[base] / ms[best]:.2f}x | {auto_cells} |"
            )
        if flop_lines:
            lines += ["", *(f"- {line}" for line in flop_lines)]
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
