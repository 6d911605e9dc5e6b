"""The GPT decode step on llama.cpp per GGUF format, against its memory floor.

On a CPU the server runs the GPT's Llama layers on llama.cpp (engine/llamacpp_gpt.py) in the
smallest GGUF format within the quality budget (engine/gpt_build.py). Per format (--formats),
on the full-size dev model (random weights at the official shapes: timings do not depend on
the values) or --model-dir, with llama.cpp's context made as the server makes it:

- step: median ms of one decode step of B rows (--batches), each row a sequence of its own at
  a mixed position around --context. The step's position is removed after it, so every timed
  step sees the same context; the formats take turns step by step, so that load from other
  processes hits them alike.
- floor: what a step must read (the GGUF file, and each row's live K/V: F16, or F32 for the F32
  format) over this machine's read bandwidth, measured in the same turns by an fp32 torch sum
  over a --probe-mib buffer (the best of its runs). step / floor: how far from memory-bound.
- prefill: median ms of a --prefill-tokens prompt (40: a navigation prompt's size), in turns.
- SNR: warm-up's quality probe's hidden states against torch fp32; 'auto' is the smallest
  format within MIN_SNR_DB, what `--gguf-format auto` serves on these weights (formats outside
  --formats are measured for it).
- word timing: the auto format's step at the smallest and largest batch without the attention
  tap, and with it reading nothing (no row wants word timing) or 4 alignment heads in 2 layers
  for every row; the three in turns.

Each table carries the load average at the time its figures were taken. --markdown (default
bench/results/decode_step.md; none with --smoke) writes the tables and the command.

Usage: python bench/bench_decode_step.py [--formats F32,Q8_0] [--batches 1,4,16] [--context 100]
       [--steps 10] [--prefill-tokens 40] [--threads N] [--probe-mib 512] [--model-dir DIR]
       python bench/bench_decode_step.py --smoke    # tiny model, two steps, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from _common import command, table, write_result
from _gguf_weights import GGUFWeights, Probe, embeds, gguf_arguments

from chattts_server.config import EngineConfig
from chattts_server.defaults import MIN_SNR_DB
from chattts_server.engine.gpt_build import smallest_within_budget
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT
from chattts_server.model.llama import DecodeBatch, PromptRun
from chattts_server.timing.types import CaptureRow


def load_average() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def in_turns(calls: dict[str, Callable[[], object]], steps: int) -> dict[str, list[float]]:
    """ms of each call, `steps` times, the calls taking turns (after two untimed rounds)."""
    for call in calls.values():
        for _ in range(2):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(steps):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - started) * 1e3)
    return times


def fill(gpt: LlamaCppGPT, rows: list[int]) -> None:
    """Sequence i holds positions 0..rows[i]-1, ready for a step at rows[i]."""
    for slot in range(gpt.num_slots):
        gpt.free_slot(slot)
    d = gpt.shape.hidden_size
    gpt.forward([PromptRun(slot, embeds(n, d), 0) for slot, n in enumerate(rows)], None)


def decode_step(gpt: LlamaCppGPT, rows: list[int], tap: bool = False) -> Callable[[], object]:
    """A step of sequences 0..len(rows)-1 at positions `rows` (filled by `fill`), reading 4
    heads in the 2 middle layers for every row if `tap`."""
    batch, layers = len(rows), (gpt.shape.num_layers // 2 - 1, gpt.shape.num_layers // 2)
    decode = DecodeBatch(
        torch.arange(batch), embeds(batch, gpt.shape.hidden_size), torch.tensor(rows), max(rows)
    )
    heads = tuple((layer, head) for layer in layers for head in (0, 1))
    capture = [CaptureRow(i, i, 0, min(32, p)) for i, p in enumerate(rows)]
    alignment = (heads, capture) if tap else None
    # The class removes only whole sequences (free_slot): the step's one position goes through
    # llama.cpp itself.
    lc, memory = gpt._lc, gpt._memory

    def step() -> None:
        _, _, captured = gpt.forward([], decode, alignment)
        assert (captured is None) == (alignment is None)
        for slot, pos in enumerate(rows):
            lc.llama_memory_seq_rm(memory, slot, pos, -1)

    return step


def prefill(gpt: LlamaCppGPT, tokens: int) -> Callable[[], object]:
    x = embeds(tokens, gpt.shape.hidden_size)

    def run() -> None:
        gpt.free_slot(0)
        gpt.forward([PromptRun(0, x, 0)], None)

    return run


def format_table(
    args: argparse.Namespace, served: dict[str, LlamaCppGPT], snr: dict[str, float], auto: str
) -> str:
    """Per format: each batch's step (x its floor) and the prefill, timed in turns."""
    prefill_ms = {
        f: statistics.median(ms)
        for f, ms in in_turns(
            {f: prefill(gpt, args.prefill_tokens) for f, gpt in served.items()}, args.steps
        ).items()
    }
    loads = [load_average()]
    for gpt in served.values():
        fill(gpt, args.rows)
    buffer = torch.ones(args.probe_mib * 2**20 // 4)  # an fp32 sum: torch's fastest plain read
    cells: dict[str, list[str]] = {f: [] for f in served}
    read_gbs = []
    for batch in args.batches:
        calls = {f: decode_step(gpt, args.rows[:batch]) for f, gpt in served.items()}
        times = in_turns({"read": buffer.sum, **calls}, args.steps)
        gbs = buffer.numel() * 4 / min(times["read"]) / 1e6
        live_tokens = sum(p + 1 for p in args.rows[:batch])
        for f, gpt in served.items():
            s = gpt.shape
            kv_bytes = s.num_layers * 2 * s.num_kv_heads * s.head_dim * (4 if f == "F32" else 2)
            floor_ms = (gpt.gguf_path.stat().st_size + live_tokens * kv_bytes) / gbs / 1e6
            ms = statistics.median(times[f])
            cells[f].append(f"{ms:.1f} ({ms / floor_ms:.1f}x)")
        read_gbs.append(f"{gbs:.1f}")
        loads.append(load_average())
        print(f"batch {batch} timed, load average {loads[-1]}", flush=True)
    header = ["format", "GGUF MiB", "hidden SNR dB"]
    header += [f"B={b} ms (x floor)" for b in args.batches]
    header += [f"{args.prefill_tokens}-token prefill ms"]
    lines = [
        [f"{f}{' (auto)' if f == auto else ''}", f"{gpt.gguf_path.stat().st_size / 2**20:.1f}"]
        + [f"{snr[f]:.1f}", *cells[f], f"{prefill_ms[f]:.1f}"]
        for f, gpt in served.items()
    ]
    lines.append(["read GB/s", "", "", *read_gbs, ""])
    lines.append(["load average", "", "", *loads[1:], loads[0]])
    return table(header, lines)


def tap_table(
    args: argparse.Namespace, plain: LlamaCppGPT, tapped: LlamaCppGPT
) -> tuple[str, dict[int, tuple[float, float]]]:
    """The auto format's step without a tap, with one reading nothing (no row in the step wants
    word timing) and with one reading the heads for every row, in turns."""
    rows = args.rows
    for gpt in (plain, tapped):
        fill(gpt, rows)
    lines, ratios = [], {}
    for batch in sorted({min(args.batches), max(args.batches)}):
        calls = {
            "off": decode_step(plain, rows[:batch]),
            "idle": decode_step(tapped, rows[:batch]),
            "on": decode_step(tapped, rows[:batch], tap=True),
        }
        ms = {name: statistics.median(t) for name, t in in_turns(calls, args.steps).items()}
        ratios[batch] = (ms["off"], ms["on"])
        lines.append([batch, *(f"{ms[k]:.1f}" for k in calls), f"{ms['on'] / ms['off']:.2f}x"])
        lines[-1].append(load_average())
    header = ["batch", "no tap ms", "tap, nothing read ms", "tap, heads read ms", "read / no tap"]
    return table([*header, "load average"], lines), ratios


def main() -> None:
    parser = gguf_arguments(__doc__, "tiny model, 2 steps, no markdown", "decode_step.md")
    parser.add_argument("--batches", default="1,4,16", help="decode batch sizes")
    parser.add_argument("--context", type=int, default=100, help="positions per row (about)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per figure")
    parser.add_argument("--prefill-tokens", type=int, default=40)
    parser.add_argument("--probe-mib", type=int, default=512, help="bandwidth probe (>> LLC)")
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.context, args.steps, args.prefill_tokens = "1,2", 16, 2, 8
        args.probe_mib, args.markdown = 64, ""
    args.batches = [int(b) for b in args.batches.split(",")]
    # Mixed positions within about +/-10% of --context, as rows that joined at different times.
    spread, num_rows = max(1, args.context // 10), max(args.batches)
    args.rows = [args.context - spread + (7 * i) % (2 * spread + 1) for i in range(num_rows)]
    torch.manual_seed(0)
    if (weights := GGUFWeights.load(args)) is not None:
        run(args, weights)


def run(args: argparse.Namespace, weights: GGUFWeights) -> None:
    probe = Probe(weights)
    max_tokens = max(max(args.rows), args.prefill_tokens, len(probe.embeds)) + 1
    batch_tokens = EngineConfig().prefill_chunk_tokens + max(args.batches)  # the server's

    def open_gpt(weight_format: str, tap: bool = False) -> LlamaCppGPT:
        return weights.llamacpp(weight_format, max(args.batches), max_tokens, batch_tokens, tap)

    def untimed_snr(weight_format: str) -> float:
        gpt = open_gpt(weight_format)
        try:
            return probe.snr_db(gpt)
        finally:
            gpt.close()

    served = {f: open_gpt(f) for f in args.formats.split(",") if f}
    snr = {f: probe.snr_db(gpt) for f, gpt in served.items()}
    auto = smallest_within_budget(untimed_snr, snr)  # gpt_build.choose_gguf_format's rule
    formats = format_table(args, served, snr, auto)
    plain = served.get(auto) or open_gpt(auto)
    taps, ratios = tap_table(args, plain, open_gpt(auto, tap=True))
    untimed = ", ".join(f"{f} {db:.1f}" for f, db in snr.items() if f not in served)
    text = f"""# Decode step on llama.cpp per GGUF format

Model: {weights.describe(args.smoke)}; context ~{args.context} positions per row (mixed),
{weights.threads} threads, median of {args.steps} steps in turns, llama.cpp batch
{batch_tokens} tokens as the server's. Command: {command()}

Each step: median ms (its multiple of the floor: the GGUF file plus the rows' live K/V over the
read bandwidth below). Hidden SNR: warm-up's quality probe against torch fp32; auto: the
smallest format within {MIN_SNR_DB:g} dB.{f" Not timed, hidden SNR dB measured for auto: {untimed}." if untimed else ""}

{formats}

## Word timing: the {auto} step with the attention tap, reading nothing or 4 heads in 2 layers for every row

{taps}
"""
    print(text)
    batch = min(args.batches)
    off, on = ratios[batch]
    print(
        f"RESULT: auto {auto}: batch {batch} step {off:.1f} ms, {on:.1f} ms with the "
        f"word-timing tap ({on / off:.2f}x), load average {load_average()}"
    )
    if args.markdown:
        write_result(args.markdown, text)


if __name__ == "__main__":
    main()
