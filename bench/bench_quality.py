"""The quality budget of the GPT's GGUF formats: what each costs against torch fp32.

On a CPU the server runs the GPT's layers on llama.cpp (engine/llamacpp_gpt.py) in the smallest
GGUF format whose hidden states are within MIN_SNR_DB of torch fp32's (engine/gpt_build.py).
Per format, against our torch forward in fp32 (LlamaDecoder, as warm-up's reference) on the
same weights: the full-size dev model (random weights at the official shapes) or --model-dir.

- probe SNR: the hidden states of warm-up's quality probe (gpt_build.QUALITY_PROBE), every
  position; 'auto' is the smallest format within MIN_SNR_DB of it, what `--gguf-format auto`
  serves on these weights. prompts SNR: the same over navigation prompts, the worst prompt's.
- decode SNR and codes = fp32: teacher-forced, so that every format sees the same inputs: torch
  fp32 prefills each prompt and decodes greedily for --steps steps; each format prefills the
  same prompt and is fed fp32's codes step by step. The SNR of those steps' hidden states, and
  how often the format's greedy codes (all 4 codebooks) equal fp32's at the same step: how often
  sampling could differ (free-running, one differing code parts the sequences for good).
- word timing: the same steps read the attention of 4 heads in 2 layers over the prompt's text,
  as the server does for word timing (torch's capture; llama.cpp's eval callback): how often
  each step's attended text token equals fp32's, and how far the word boundaries it gives
  (timing/attention.py) lie from fp32's, in ms. Random weights have no aligning head, so only
  the difference between the two forwards means anything.

SNR is 10 log10(sum ref^2 / sum (x - ref)^2), dB. Random weights are not trained weights
(trained ones have outlier channels that the block quantizers handle worse): re-run with
--model-dir before trusting a format there; the server measures the probe SNR at warm-up anyway.
Writes --markdown (default bench/results/quality.md; none with --smoke).

Usage: python bench/bench_quality.py [--formats F16,Q8_0] [--steps 200] [--model-dir DIR]
       python bench/bench_quality.py --smoke    # tiny model, 12 steps, writes nothing
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
from _common import command, table, write_result
from _gguf_weights import CPU, GGUFWeights, Probe, gguf_arguments
from torch import Tensor

from chattts_server.config import EngineConfig
from chattts_server.defaults import MIN_SNR_DB
from chattts_server.engine.gpt import GPTModel, TorchGPT
from chattts_server.engine.gpt_build import fp32_reference, smallest_within_budget
from chattts_server.engine.heads import Heads
from chattts_server.engine.prompts import PromptBuilder
from chattts_server.engine.utterance import VoiceKind, VoiceSpec
from chattts_server.model.llama import DecodeBatch, PromptRun
from chattts_server.model.llama_layers import LlamaShape
from chattts_server.model.warmup_cache import snr_db
from chattts_server.text.spans import Traced
from chattts_server.text.words import spoken_words
from chattts_server.timing.attention import attention_timing
from chattts_server.timing.types import CaptureRow, TokenAlignment

NAVIGATION = (
    "In 300 metres, turn left onto Station Road.",
    "Keep right at the fork, then take the second exit at the roundabout.",
    "You have arrived. Your destination is on the left.",
)
SAMPLES_PER_TOKEN = 512


def timing_heads(shape: LlamaShape) -> tuple[tuple[int, int], ...]:
    """Stand-ins for alignment heads (random weights have none): 4 heads in 2 layers, a
    quarter and a third of the way up (layers 5 and 6 of 20; 0 of the tiny model's 2)."""
    first, second = shape.num_layers // 4, shape.num_layers // 3
    return ((first, 0), (first, shape.num_heads // 2), (second, 1), (second, shape.num_heads - 1))


@dataclass
class Decode:
    """One prompt's teacher-forced decode: per step the hidden state the codes were read from,
    the greedy codes, and the text token the `timing_heads` attend to most."""

    hiddens: Tensor  # (steps, D)
    codes: Tensor  # (steps, num_vq)
    path: list[int]


def teacher_forced(
    gpt: GPTModel, heads: Heads, prompt: Tensor, steps: int, text: tuple, forced: Tensor | None
) -> Decode:
    """Prefill `prompt` (L, D) in slot 0, then `steps` decode steps, each fed `forced`'s codes
    (its own greedy codes where None), reading the attention over prompt positions `text`."""
    gpt.free_slot(0)
    last, _, _ = gpt.forward([PromptRun(0, prompt, 0)], None)
    hidden: Tensor | None = last[0][None]
    hiddens, codes, path = [], [], []
    alignment = (timing_heads(gpt.shape), [CaptureRow(0, 0, *text)])
    for step in range(steps):
        assert hidden is not None
        greedy = heads.code_logits(hidden).argmax(-1)  # (1, num_vq)
        hiddens.append(hidden[0])
        codes.append(greedy[0])
        feed = greedy if forced is None else forced[step][None]
        step_in = DecodeBatch(
            torch.tensor([0]), heads.code_embeds(feed), torch.tensor([len(prompt) + step])
        )
        _, hidden, capture = gpt.forward([], step_in, alignment)
        assert capture is not None, "this forward reads no attention"
        path.append(int(capture.row_weights(0).mean(0).argmax()))
    gpt.free_slot(0)
    return Decode(torch.stack(hiddens), torch.stack(codes), path)


class Prompts:
    """The navigation prompts, fp32's answers on them, and a format's measured against those."""

    def __init__(self, weights: GGUFWeights, steps: int) -> None:
        builder, modules = PromptBuilder(weights.modules, CPU), weights.modules
        self.heads, self.steps = Heads.from_embed(modules.embed), steps
        self.texts = [builder.normalize(text) for text in NAVIGATION]
        built = [
            builder.code_prompt(text, VoiceSpec(VoiceKind.SEED, seed=i), 5)
            for i, text in enumerate(self.texts)
        ]
        self.embeds = [p.embeds.float() for p in built]
        self.tokens = [p.text_tokens for p in built]
        assert all(t is not None for t in self.tokens)
        self.max_tokens = max(64, max(len(p) for p in self.embeds) + steps + 1)
        config = EngineConfig(max_streams=1, max_tokens=self.max_tokens)
        fp32 = TorchGPT.build(modules, config, CPU, torch.float32, decode_graphs="off")
        self.prefill_refs = [fp32_reference(modules, p) for p in self.embeds]
        self.refs = self.decode(fp32)
        self.ref_bounds = [self.bounds(i, d.path) for i, d in enumerate(self.refs)]

    def decode(self, gpt: GPTModel, forced: list[Decode] | None = None) -> list[Decode]:
        runs = []
        for i, (prompt, tokens) in enumerate(zip(self.embeds, self.tokens, strict=True)):
            codes = None if forced is None else forced[i].codes
            assert tokens is not None
            runs.append(
                teacher_forced(gpt, self.heads, prompt, self.steps, tokens.positions, codes)
            )
        return runs

    def bounds(self, i: int, path: list[int]) -> list[float]:
        """Each word's start and end, ms, as the server times words by `path`."""
        tokens = self.tokens[i]
        assert tokens is not None
        alignment = TokenAlignment(tuple(path), tokens.token_chars)
        words = spoken_words(Traced.source(self.texts[i]))
        timing = attention_timing(
            words, alignment, len(path) * SAMPLES_PER_TOKEN, SAMPLES_PER_TOKEN
        )
        return [s / 24.0 for w in timing.words for s in (w.start_sample, w.end_sample)]

    def measure(self, weights: GGUFWeights, probe: Probe, weight_format: str) -> dict[str, float]:
        gpt = weights.llamacpp(weight_format, 1, self.max_tokens, self.max_tokens, tap=True)
        try:
            found = {"probe": probe.snr_db(gpt), "MiB": gpt.gguf_path.stat().st_size / 2**20}
            found["prompts"] = min(
                snr_db(ref, gpt.hidden_states(0, p))
                for ref, p in zip(self.prefill_refs, self.embeds, strict=True)
            )
            runs = self.decode(gpt, self.refs)
        finally:
            gpt.close()
        pairs = list(zip(runs, self.refs, strict=True))
        found["decode"] = snr_db(
            torch.cat([r.hiddens for r in self.refs]), torch.cat([r.hiddens for r in runs])
        )
        found["agree"] = (
            100 * torch.cat([(r.codes == f.codes).all(-1) for r, f in pairs]).float().mean().item()
        )
        same = [a == b for r, f in pairs for a, b in zip(r.path, f.path, strict=True)]
        found["path"] = 100 * sum(same) / len(same)
        moved = [
            abs(a - b)
            for i, (run, ref) in enumerate(zip(runs, self.ref_bounds, strict=True))
            for a, b in zip(self.bounds(i, run.path), ref, strict=True)
        ]
        found["bound_mean_ms"], found["bound_max_ms"] = sum(moved) / len(moved), max(moved)
        load = f", load average {os.getloadavg()[0]:.1f}"
        print(f"{weight_format}: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items()) + load)
        return found


def main() -> None:
    parser = gguf_arguments(__doc__, "tiny model, 12 steps, no markdown", "quality.md")
    parser.add_argument("--steps", type=int, default=200, help="teacher-forced decode steps")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.markdown = 12, ""
    if (weights := GGUFWeights.load(args)) is None:
        return
    with torch.inference_mode():
        probe, prompts = Probe(weights), Prompts(weights, args.steps)
        rows = {f: prompts.measure(weights, probe, f) for f in args.formats.split(",") if f}

        def probe_snr(weight_format: str) -> float:
            rows[weight_format] = prompts.measure(weights, probe, weight_format)
            return rows[weight_format]["probe"]

        # gpt_build.choose_gguf_format's rule, measuring what --formats left out
        auto = smallest_within_budget(probe_snr, {f: r["probe"] for f, r in rows.items()})
    report(args, weights, rows, auto)


def report(
    args: argparse.Namespace, weights: GGUFWeights, rows: dict[str, dict[str, float]], auto: str
) -> None:
    header = ["format", "GGUF MiB", "probe SNR dB", "worst prompt SNR dB", "decode SNR dB"]
    header += ["greedy codes = fp32", "attended token = fp32"]
    header += ["word bounds vs fp32, mean / max ms", "within budget"]
    lines = [
        [f"{f}{' (auto)' if f == auto else ''}"]
        + [f"{r[k]:.1f}" for k in ("MiB", "probe", "prompts", "decode")]
        + [f"{r['agree']:.1f}%", f"{r['path']:.1f}%"]
        + [f"{r['bound_mean_ms']:.1f} / {r['bound_max_ms']:.1f}"]
        + ["yes" if r["probe"] >= MIN_SNR_DB else "no"]
        for f, r in rows.items()
    ]
    text = f"""# Quality budget of the GPT's GGUF formats

Model: {weights.describe(args.smoke)}; reference: torch fp32 (LlamaDecoder). Budget: probe SNR
>= {MIN_SNR_DB:g} dB; auto: the smallest format within it. Prompts: {len(NAVIGATION)}
navigation prompts, {args.steps} teacher-forced decode steps each at batch 1 (every format fed
fp32's greedy codes). Load average {os.getloadavg()[0]:.1f} (nothing here is timed). Command:
{command()}

{table(header, lines)}

Navigation prompts: {" / ".join(f'"{t}"' for t in NAVIGATION)}

Word timing: heads {timing_heads(weights.shape)} read as the server reads alignment heads;
random weights have none that align, so only the difference from fp32 means anything.
"""
    print(text)
    r = rows[auto]
    print(
        f"RESULT: auto {auto} (smallest within {MIN_SNR_DB:g} dB): probe SNR {r['probe']:.1f} dB, "
        f"greedy codes = fp32 {r['agree']:.1f}% over {args.steps * len(NAVIGATION)} "
        f"teacher-forced steps; word bounds {r['bound_mean_ms']:.1f} ms from fp32's on average"
    )
    if args.markdown:
        write_result(args.markdown, text)


if __name__ == "__main__":
    main()
