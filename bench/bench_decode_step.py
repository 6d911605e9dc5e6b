"""The GPT decode step on llama.cpp per GGUF format, against its memory floor.

On a CPU the server runs the GPT's Llama layers on llama.cpp (engine/llamacpp_gpt.py) in the
smallest GGUF format within the quality budget (engine/gpt_build.py). Per format (--formats),
on the full-size dev model (random weights at the official shapes: timings do not depend on
the values) or --model-dir, with llama.cpp's context made as the server makes it:

- step: median ms of one decode step of B rows (--batches), each row a sequence of its own at
  a mixed position around --context (rows that joined at different times). The step's position
  is removed after it, so every timed step sees the same context. The formats take turns step
  by step, so that load from other processes hits them alike.
- floor: what a step must read (the GGUF file, and each row's live K/V: F16, or F32 for the F32
  format) over this machine's read bandwidth, measured in the same turns by an fp32 torch sum
  over a --probe-mib buffer on the same threads (the best of its runs). step / floor says how
  far a step is from memory-bound.
- prefill: median ms of a --prefill-tokens prompt (40: a navigation prompt's size), in turns.
- SNR: the hidden states of warm-up's quality probe (gpt_build.QUALITY_PROBE) against torch fp32
  (gpt_build.fp32_reference); 'auto' is the smallest format within MIN_SNR_DB, the format
  `--gguf-format auto` serves on these weights (formats outside --formats are measured for it).
- word timing: the auto format's step at the smallest and largest batch in a context without
  the attention tap, and in one with it (made where alignment heads exist), reading nothing
  (no row of the step wants word timing) or 4 alignment heads in 2 layers for every row; the
  three in turns.

Each table carries the load average (1 min) at the time its figures were taken. --markdown
(default bench/results/decode_step.md; none with --smoke) writes the tables and the command.

Usage: python bench/bench_decode_step.py [--formats F32,Q8_0] [--batches 1,4,16] [--context 100]
       [--steps 10] [--prefill-tokens 40] [--threads N] [--probe-mib 512] [--model-dir DIR]
       python bench/bench_decode_step.py --smoke    # tiny model, two steps, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from _gguf_weights import CPU, REPO, GGUFWeights, add_weight_arguments

from chattts_server.config import EngineConfig
from chattts_server.defaults import GGUF_FORMATS, MIN_SNR_DB
from chattts_server.engine.gpt_build import (
    QUALITY_PROBE,
    fp32_reference,
    smallest_within_budget,
)
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT, llamacpp_unavailable
from chattts_server.engine.prompts import PromptBuilder
from chattts_server.engine.utterance import VoiceSpec
from chattts_server.model.llama import DecodeBatch, PromptRun
from chattts_server.model.llama_layers import LlamaShape
from chattts_server.model.warmup_cache import snr_db
from chattts_server.timing.types import CaptureRow

READ = "read"
"""The bandwidth probe's name among the contenders of a turn."""


@dataclass
class Format:
    """One GGUF format's llama.cpp context, its slots filled for the decode steps."""

    weight_format: str
    gpt: LlamaCppGPT
    file_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        s = self.gpt.shape
        element_bytes = 4 if self.weight_format == "F32" else 2
        return s.num_layers * 2 * s.num_kv_heads * s.head_dim * element_bytes


def load_average() -> float:
    return os.getloadavg()[0]


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


def positions(batch: int, context: int) -> list[int]:
    """Mixed positions within about +/-10% of `context`, as rows that joined at different times;
    a smaller batch's are the first of a larger one's."""
    spread = max(1, context // 10)
    return [context - spread + (7 * i) % (2 * spread + 1) for i in range(batch)]


def embeds(tokens: int, hidden_size: int) -> torch.Tensor:
    return 0.02 * torch.randn(tokens, hidden_size)  # the scale of ChatTTS's text embeddings


def fill(gpt: LlamaCppGPT, rows: list[int]) -> None:
    """Sequence i holds positions 0..rows[i]-1, ready for a step at rows[i]."""
    for slot in range(gpt.num_slots):
        gpt.free_slot(slot)
    d = gpt.shape.hidden_size
    gpt.forward([PromptRun(slot, embeds(n, d), 0) for slot, n in enumerate(rows)], None)


def decode_step(
    gpt: LlamaCppGPT, rows: list[int], capture: list[CaptureRow] | None = None
) -> Callable[[], object]:
    """A step of sequences 0..len(rows)-1 at positions `rows` (filled by `fill`), capturing the
    alignment heads' attention for `capture`, if given."""
    batch = len(rows)
    decode = DecodeBatch(
        torch.arange(batch), embeds(batch, gpt.shape.hidden_size), torch.tensor(rows), max(rows)
    )
    alignment = None if capture is None else (tap_heads(gpt.shape), capture)
    # The class removes only whole sequences (free_slot): the step's one position goes through
    # llama.cpp itself.
    lc, memory = gpt._lc, gpt._memory

    def step() -> None:
        _, _, captured = gpt.forward([], decode, alignment)
        assert (captured is None) == (alignment is None)
        for slot, pos in enumerate(rows):
            lc.llama_memory_seq_rm(memory, slot, pos, -1)

    return step


def tap_heads(shape: LlamaShape) -> tuple[tuple[int, int], ...]:
    """4 alignment heads in the 2 middle layers (the calibrated ones vary with the weights)."""
    layers = (shape.num_layers // 2 - 1, shape.num_layers // 2)
    return tuple((layer, head) for layer in layers for head in (0, 1))


def prefill(gpt: LlamaCppGPT, tokens: int) -> Callable[[], object]:
    x = embeds(tokens, gpt.shape.hidden_size)

    def run() -> None:
        gpt.free_slot(0)
        gpt.forward([PromptRun(0, x, 0)], None)

    return run


def read_probe(mib: int) -> tuple[Callable[[], object], int]:
    """An fp32 sum of `mib` MiB (torch's fastest plain read) and its byte count."""
    buffer = torch.ones(mib * 2**20 // 4)
    return (lambda: buffer.sum()), buffer.numel() * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(GGUF_FORMATS), help="GGUF formats to time")
    parser.add_argument("--batches", default="1,4,16", help="decode batch sizes")
    parser.add_argument("--context", type=int, default=100, help="positions per row (about)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per figure")
    parser.add_argument("--prefill-tokens", type=int, default=40)
    parser.add_argument(
        "--probe-mib", type=int, default=512, help="bandwidth probe buffer (MiB, >> LLC)"
    )
    add_weight_arguments(parser)
    parser.add_argument(
        "--markdown",
        default=str(REPO / "bench" / "results" / "decode_step.md"),
        help="write the tables here ('': nowhere)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, batches 1,2, two steps, no markdown"
    )
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.context, args.steps, args.prefill_tokens = "1,2", 16, 2, 8
        args.probe_mib, args.markdown = 64, ""
    missing = llamacpp_unavailable()
    if missing is not None:
        print(f"nothing to time: {missing}")
        return

    torch.manual_seed(0)
    weights = GGUFWeights.load(args)
    modules, shape, threads, files = weights.modules, weights.shape, weights.threads, weights.files
    batches = [int(b) for b in args.batches.split(",")]
    formats = [f for f in args.formats.split(",") if f]
    rows = positions(max(batches), args.context)
    # Warm-up's quality check: the probe's hidden states against torch fp32, each format.
    prompts = PromptBuilder(modules, CPU)
    probe = prompts.code_prompt(prompts.normalize(QUALITY_PROBE), VoiceSpec(), 5).embeds.float()
    reference = fp32_reference(modules, probe)
    max_tokens = max(max(rows), args.prefill_tokens, len(probe)) + 1
    max_batch_tokens = EngineConfig().prefill_chunk_tokens + max(batches)  # the server's

    def open_gpt(weight_format: str, tap: bool = False) -> LlamaCppGPT:
        return LlamaCppGPT(
            weights.path(weight_format),
            shape,
            max(batches),
            max_tokens,
            max_batch_tokens,
            threads,
            weight_format,
            tap,
        )

    served = {f: Format(f, open_gpt(f), files.path(f).stat().st_size) for f in formats}

    def hidden_snr(weight_format: str) -> float:
        if weight_format in served:
            return snr_db(reference, served[weight_format].gpt.hidden_states(0, probe))
        gpt = open_gpt(weight_format)
        try:
            return snr_db(reference, gpt.hidden_states(0, probe))
        finally:
            gpt.close()

    snr = {f: hidden_snr(f) for f in formats}
    auto = smallest_within_budget(hidden_snr, snr)  # gpt_build.choose_gguf_format's rule

    prefill_ms = {
        f: statistics.median(ms)
        for f, ms in in_turns(
            {f: prefill(s.gpt, args.prefill_tokens) for f, s in served.items()}, args.steps
        ).items()
    }
    prefill_load = load_average()
    for s in served.values():
        fill(s.gpt, rows)
    read, read_bytes = read_probe(args.probe_mib)
    cells: dict[str, list[str]] = {f: [] for f in served}
    read_gbs, loads = [], []
    for batch in batches:
        calls = {READ: read, **{f: decode_step(s.gpt, rows[:batch]) for f, s in served.items()}}
        times = in_turns(calls, args.steps)
        gbs = read_bytes / min(times[READ]) / 1e6
        live_tokens = sum(p + 1 for p in rows[:batch])
        for f, s in served.items():
            floor_ms = (s.file_bytes + live_tokens * s.kv_bytes_per_token) / gbs / 1e6
            ms = statistics.median(times[f])
            cells[f].append(f"{ms:.1f} ({ms / floor_ms:.1f}x)")
        read_gbs.append(f"{gbs:.1f}")
        loads.append(f"{load_average():.1f}")
        print(f"batch {batch} timed, load average {loads[-1]}", flush=True)

    # Word timing: the auto format's step without a tap, with one reading nothing (no row in the
    # step wants word timing) and with one reading the heads for every row, in turns.
    plain = served[auto].gpt if auto in served else open_gpt(auto)
    tapped = open_gpt(auto, tap=True)
    for gpt in (plain, tapped):
        fill(gpt, rows)
    tap_lines = []
    tap_ms = {}
    for batch in sorted({min(batches), max(batches)}):
        capture = [CaptureRow(i, i, 0, min(32, p)) for i, p in enumerate(rows[:batch])]
        calls = {
            "off": decode_step(plain, rows[:batch]),
            "idle": decode_step(tapped, rows[:batch]),
            "on": decode_step(tapped, rows[:batch], capture),
        }
        ms = {name: statistics.median(t) for name, t in in_turns(calls, args.steps).items()}
        off, idle, on = ms["off"], ms["idle"], ms["on"]
        tap_ms[batch] = (off, on)
        tap_lines.append(
            f"| {batch} | {off:.1f} | {idle:.1f} | {on:.1f} | {on / off:.2f}x "
            f"| {load_average():.1f} |"
        )

    header = (
        f"Model: {'tiny dev (smoke)' if args.smoke else weights.model_dir} ({shape.num_layers} layers, "
        f"hidden {shape.hidden_size}); context ~{args.context} positions per row (mixed), "
        f"{threads} threads, median of {args.steps} steps in turns, llama.cpp batch "
        f"{max_batch_tokens} tokens as the server's."
    )
    cols = [f"B={b} ms (x floor)" for b in batches]
    untimed = ", ".join(f"{f} {db:.1f}" for f, db in snr.items() if f not in served)
    blank = "| " * 3
    script = Path(sys.argv[0]).resolve().relative_to(REPO).as_posix()
    lines = [
        "# Decode step on llama.cpp per GGUF format",
        "",
        header,
        "",
        f"Command: `python {' '.join([script, *sys.argv[1:]])}`",
        "",
        "Each step: median ms (its multiple of the floor: the GGUF file plus the rows' live K/V "
        "over the read bandwidth below). Hidden SNR: warm-up's quality probe against torch fp32; "
        f"auto: the smallest format within {MIN_SNR_DB:g} dB.",
        "",
        "| format | GGUF MiB | hidden SNR dB | "
        + " | ".join(cols)
        + f" | {args.prefill_tokens}-token prefill ms |",
        "|---" * (len(cols) + 4) + "|",
        *(
            f"| {f}{' (auto)' if f == auto else ''} | {s.file_bytes / 2**20:.1f} | {snr[f]:.1f} | "
            + " | ".join(cells[f])
            + f" | {prefill_ms[f]:.1f} |"
            for f, s in served.items()
        ),
        f"| read GB/s {blank}" + " | ".join(read_gbs) + " | |",
        f"| load average {blank}" + " | ".join(loads) + f" | {prefill_load:.1f} |",
        *(["", f"Not timed, hidden SNR dB measured for auto: {untimed}."] if untimed else []),
        "",
        f"## Word timing: the {auto} step with the attention tap, reading nothing or "
        f"{len(tap_heads(shape))} heads in 2 layers for every row",
        "",
        "| batch | no tap ms | tap, nothing read ms | tap, heads read ms | read / no tap "
        "| load average |",
        "|---|---|---|---|---|---|",
        *tap_lines,
    ]
    print("\n".join(lines))
    batch = min(batches)
    off, on = tap_ms[batch]
    print(
        f"RESULT: auto {auto}: batch {batch} step {off:.1f} ms, {on:.1f} ms with the word-timing "
        f"tap ({on / off:.2f}x), load average {load_average():.1f}"
    )
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
