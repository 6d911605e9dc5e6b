"""The quality budget of the GPT's GGUF formats: what each costs against torch fp32.

On a CPU the server runs the GPT's layers on llama.cpp (engine/llamacpp_gpt.py) in the smallest
GGUF format whose hidden states are within MIN_SNR_DB of torch fp32's (engine/gpt_build.py).
Per format, against our torch forward in fp32 (LlamaDecoder, as warm-up's reference) on the
same weights: the full-size dev model (random weights at the official shapes) or --model-dir.

- probe SNR: the hidden states of warm-up's quality probe (gpt_build.QUALITY_PROBE), every
  position; 'auto' is the smallest format within MIN_SNR_DB of it, the format `--gguf-format
  auto` serves on these weights.
- prompts SNR: the same over navigation prompts (below), the worst prompt's.
- decode SNR and codes = fp32: teacher-forced, so that every format sees the same inputs: torch
  fp32 prefills each prompt and decodes greedily for --steps steps; each format prefills the
  same prompt and is fed fp32's codes step by step. The SNR of those steps' hidden states (all
  prompts together), and how often the format's greedy codes (all 4 codebooks) equal fp32's at
  the same step: how often sampling could differ. Free-running would tell less: after one
  differing code the two sequences part for good, and agreement after it measures nothing.
- GGUF MiB: the file's size.
- word timing: the same teacher-forced steps read the attention of 4 heads in 2 layers over
  the prompt's text, as the server does for word timing (torch's capture; llama.cpp's eval
  callback on `kq_soft_max`): how often each step's attended text token equals fp32's, and how
  far the word boundaries it gives (timing/attention.py) lie from fp32's, in ms. Random
  weights have no aligning head, so the boundaries themselves mean nothing here: only the
  difference between the two forwards does.

SNR is 10 log10(sum ref^2 / sum (x - ref)^2), dB. Random weights are not trained weights
(trained ones have outlier channels that the block quantizers handle worse): re-run with
--model-dir on the official assets before trusting a format there; the server measures the
probe SNR on its loaded weights at warm-up anyway.

Writes --markdown (default bench/results/quality.md; none with --smoke).

Usage: python bench/bench_quality.py [--formats F16,Q8_0] [--steps 200] [--model-dir DIR]
       python bench/bench_quality.py --smoke    # tiny model, 12 steps, writes nothing
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from _gguf_weights import CPU, REPO, GGUFWeights, add_weight_arguments
from torch import Tensor

from chattts_server.config import EngineConfig
from chattts_server.defaults import GGUF_FORMATS, MIN_SNR_DB
from chattts_server.engine.gpt import GPTModel, TorchGPT
from chattts_server.engine.gpt_build import (
    QUALITY_PROBE,
    fp32_reference,
    smallest_within_budget,
)
from chattts_server.engine.heads import Heads
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT, llamacpp_unavailable
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


def timing_heads(shape: LlamaShape) -> tuple[tuple[int, int], ...]:
    """Stand-ins for alignment heads (random weights have none): 4 heads in 2 layers, a
    quarter and a third of the way up (layers 5 and 6 of 20; 0 of the tiny model's 2)."""
    first, second = shape.num_layers // 4, shape.num_layers // 3
    return ((first, 0), (first, shape.num_heads // 2), (second, 1), (second, shape.num_heads - 1))


SAMPLES_PER_TOKEN = 512


def teacher_forced(
    gpt: GPTModel,
    heads: Heads,
    prompt: Tensor,
    steps: int,
    text: tuple[int, int],
    forced: Tensor | None = None,
) -> tuple[Tensor, Tensor, list[int]]:
    """Prefill `prompt` (L, D) in slot 0, then `steps` decode steps, each fed `forced`'s codes
    (its own greedy codes where None): the hidden states (steps, D) the codes were read from,
    the greedy codes (steps, num_vq), and per step the text token (of prompt positions `text`)
    the `timing_heads` attend to most."""
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
        position = torch.tensor([len(prompt) + step])
        step_in = DecodeBatch(torch.tensor([0]), heads.code_embeds(feed), position)
        _, hidden, capture = gpt.forward([], step_in, alignment)
        assert capture is not None, "this forward reads no attention"
        path.append(int(capture.row_weights(0).mean(0).argmax()))
    gpt.free_slot(0)
    return torch.stack(hiddens), torch.stack(codes), path


def word_bounds_ms(path: list[int], text: str, token_chars: tuple) -> list[float]:
    """Each word's start and end, ms, as the server times words by `path`."""
    alignment = TokenAlignment(tuple(path), token_chars)
    words = spoken_words(Traced.source(text))
    timing = attention_timing(words, alignment, len(path) * SAMPLES_PER_TOKEN, SAMPLES_PER_TOKEN)
    return [s / 24.0 for w in timing.words for s in (w.start_sample, w.end_sample)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(GGUF_FORMATS), help="GGUF formats")
    parser.add_argument("--steps", type=int, default=200, help="teacher-forced decode steps")
    add_weight_arguments(parser)
    parser.add_argument(
        "--markdown",
        default=str(REPO / "bench" / "results" / "quality.md"),
        help="write the tables here ('': nowhere)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model, 12 steps, no markdown")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.markdown = 12, ""
    missing = llamacpp_unavailable()
    if missing is not None:
        print(f"nothing to measure: {missing}")
        return

    weights = GGUFWeights.load(args)
    modules, shape, threads = weights.modules, weights.shape, weights.threads
    prompts, heads = PromptBuilder(modules, CPU), Heads.from_embed(modules.embed)
    probe = prompts.code_prompt(prompts.normalize(QUALITY_PROBE), VoiceSpec(), 5).embeds.float()
    spoken = [prompts.normalize(text) for text in NAVIGATION]
    built = [
        prompts.code_prompt(text, VoiceSpec(VoiceKind.SEED, seed=i), 5)
        for i, text in enumerate(spoken)
    ]
    navigation = [p.embeds.float() for p in built]
    texts = [p.text_tokens for p in built]
    assert all(t is not None for t in texts)
    max_tokens = max(64, max(len(p) for p in [probe, *navigation]) + args.steps + 1)
    config = EngineConfig(max_streams=1, max_tokens=max_tokens)
    with torch.inference_mode():
        fp32 = TorchGPT.build(modules, config, CPU, torch.float32, decode_graphs="off")
        probe_ref = fp32_reference(modules, probe)
        prompt_refs = [fp32_reference(modules, p) for p in navigation]
        decode_refs = [
            teacher_forced(fp32, heads, p, args.steps, t.positions)  # type: ignore[union-attr]
            for p, t in zip(navigation, texts, strict=True)
        ]
    ref_bounds = [
        word_bounds_ms(path, text, t.token_chars)  # type: ignore[union-attr]
        for (_, _, path), text, t in zip(decode_refs, spoken, texts, strict=True)
    ]

    def measure(weight_format: str) -> dict[str, float]:
        path = weights.path(weight_format)
        gpt = LlamaCppGPT(path, shape, 1, max_tokens, max_tokens, threads, weight_format, True)
        try:
            found = {
                "probe": snr_db(probe_ref, gpt.hidden_states(0, probe)),
                "prompts": min(
                    snr_db(ref, gpt.hidden_states(0, p))
                    for ref, p in zip(prompt_refs, navigation, strict=True)
                ),
                "MiB": path.stat().st_size / 2**20,
            }
            runs = [
                teacher_forced(gpt, heads, p, args.steps, t.positions, codes)  # type: ignore[union-attr]
                for p, t, (_, codes, _) in zip(navigation, texts, decode_refs, strict=True)
            ]
        finally:
            gpt.close()
        found["decode"] = snr_db(
            torch.cat([h for h, _, _ in decode_refs]), torch.cat([h for h, _, _ in runs])
        )
        agree = torch.cat(
            [(c == ref).all(-1) for (_, c, _), (_, ref, _) in zip(runs, decode_refs, strict=True)]
        )
        found["agree"] = 100 * agree.float().mean().item()
        same = [
            a == b
            for (_, _, p), (_, _, q) in zip(runs, decode_refs, strict=True)
            for a, b in zip(p, q, strict=True)
        ]
        found["path"] = 100 * sum(same) / len(same)
        moved = [
            abs(a - b)
            for (_, _, p), text, t, ref in zip(runs, spoken, texts, ref_bounds, strict=True)
            for a, b in zip(word_bounds_ms(p, text, t.token_chars), ref, strict=True)  # type: ignore[union-attr]
        ]
        found["bound_mean_ms"] = sum(moved) / len(moved)
        found["bound_max_ms"] = max(moved)
        print(
            f"{weight_format}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in found.items())
            + f", load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        return found

    formats = [f for f in args.formats.split(",") if f]
    with torch.inference_mode():
        rows = {f: measure(f) for f in formats}

        def probe_snr(weight_format: str) -> float:
            rows[weight_format] = measure(weight_format)
            return rows[weight_format]["probe"]

        # gpt_build.choose_gguf_format's rule, measuring what --formats left out
        auto = smallest_within_budget(probe_snr, {f: r["probe"] for f, r in rows.items()})

    num_steps = args.steps * len(navigation)
    script = Path(sys.argv[0]).resolve().relative_to(REPO).as_posix()
    lines = [
        "# Quality budget of the GPT's GGUF formats",
        "",
        f"Model: {'tiny dev (smoke)' if args.smoke else weights.model_dir} ({shape.num_layers} layers, "
        f"hidden {shape.hidden_size}); reference: torch fp32 (LlamaDecoder). Budget: probe "
        f"SNR >= {MIN_SNR_DB:g} dB; auto: the smallest format within it. Prompts: "
        f"{len(navigation)} navigation prompts, {args.steps} teacher-forced decode steps each "
        f"at batch 1 (every format fed fp32's greedy codes). Load average "
        f"{os.getloadavg()[0]:.1f} (nothing here is timed). Command: "
        f"`python {' '.join([script, *sys.argv[1:]])}`",
        "",
        "| format | GGUF MiB | probe SNR dB | worst prompt SNR dB | decode SNR dB "
        "| greedy codes = fp32 | attended token = fp32 | word bounds vs fp32, mean / max ms "
        "| within budget |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {f}{' (auto)' if f == auto else ''} | {r['MiB']:.1f} | {r['probe']:.1f} "
            f"| {r['prompts']:.1f} | {r['decode']:.1f} | {r['agree']:.1f}% | {r['path']:.1f}% "
            f"| {r['bound_mean_ms']:.1f} / {r['bound_max_ms']:.1f} "
            f"| {'yes' if r['probe'] >= MIN_SNR_DB else 'no'} |"
            for f, r in rows.items()
        ),
        "",
        "Navigation prompts: " + " / ".join(f'"{t}"' for t in NAVIGATION),
        "",
        f"Word timing: heads {timing_heads(shape)} read as the server reads alignment heads; random "
        "weights have none that align, so only the difference from fp32 means anything.",
    ]
    print("\n".join(lines))
    print(
        f"RESULT: auto {auto} (smallest within {MIN_SNR_DB:g} dB): probe SNR "
        f"{rows[auto]['probe']:.1f} dB, greedy codes = fp32 {rows[auto]['agree']:.1f}% over "
        f"{num_steps} teacher-forced steps; word bounds {rows[auto]['bound_mean_ms']:.1f} ms "
        "from fp32's on average"
    )
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
