"""Quality budget of the GPT's linear modes: what int8 and bf16 weights cost against fp32.

Teacher-forced, so that every mode sees the same inputs: the fp32 reference ('dense', fp32 K/V)
prefills a prompt and decodes greedily for --steps steps; every mode then prefills the same
prompt and is fed the reference's codes step by step, with K/V as the server keeps them for it
(bf16 for the lossy modes on a CPU with fast bf16; one extra row shows fp32 linears with bf16
K/V, to tell the two costs apart). Per mode:

- hidden SNR: the final-normed last hidden state (what the Decoder consumes) against fp32, dB;
- mel SNR: ChatTTS's Decoder run on those hidden states, against the Decoder on fp32's, dB;
- code agreement: how often the mode's greedy codes equal fp32's at the same step (all 4
  codebooks), a measure of how often sampling could differ;
- within budget: hidden SNR >= 30 dB, the bar `--quantize auto` applies at warm-up;
- decode ms: one decode step at batch 1 and batch 16, the modes timed in turn.

Full-size dev model (random weights at the official shapes) unless --smoke (tiny model, a few
steps, output in a temporary folder). Random weights are not trained weights: real checkpoints
have outlier activations that dynamic int8 quantization handles worse; re-run this with
--model-dir on the official assets before trusting int8 there (the server re-checks the SNR on
the loaded weights at warm-up anyway).

Writes <out>/quality.md.

Usage: python bench/bench_quality.py [--steps 200] [--prompt-tokens 40] [--modes ...]
       [--time-batches 1,16] [--model-dir DIR] [--out bench/results] [--smoke]
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
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "server"), str(REPO / "client")]

from chattts_server.defaults import MIN_SNR_DB  # noqa: E402
from chattts_server.engine.backend_choice import llamacpp_unavailable  # noqa: E402
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT  # noqa: E402
from chattts_server.model.autotune import snr_db  # noqa: E402
from chattts_server.model.dev_assets import build_dev_assets  # noqa: E402
from chattts_server.model.gguf_export import GGUFCache  # noqa: E402
from chattts_server.model.kv_cache import SlotKVCache  # noqa: E402
from chattts_server.model.linear_modes import MODES, modes_for  # noqa: E402
from chattts_server.model.llama import (  # noqa: E402
    DecodeBatch,
    LlamaDecoder,
    LlamaShape,
    PromptRun,
    served_kv_dtype,
)
from chattts_server.model.loader import load_chattts  # noqa: E402
from chattts_server.model.mel_decoder import decode_mel  # noqa: E402

BUDGET_DB = MIN_SNR_DB
REFERENCE = "dense"


def run_mode(
    llama: LlamaDecoder,
    cache: SlotKVCache,
    mode: str,
    prompt: torch.Tensor,
    head_code: torch.Tensor,
    emb_code: torch.Tensor,
    forced: torch.Tensor | None,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill `prompt`, then `steps` decode steps fed `forced` codes (greedy when None).
    Returns hidden states (steps, D) and the greedy codes (steps, num_vq) at each step."""
    num_vq = head_code.shape[0]
    hidden = llama.prefill(0, prompt, 0, cache, mode=mode)[-1:]
    hiddens, codes = [], []
    for step in range(steps):
        hiddens.append(hidden[0])
        logits = torch.einsum("bd,qvd->bqv", hidden.float(), head_code)  # (1, num_vq, V)
        greedy = logits.argmax(-1)[0]  # (num_vq,)
        codes.append(greedy)
        feed = greedy if forced is None else forced[step]
        x = emb_code[torch.arange(num_vq), feed].sum(0, keepdim=True)
        position = torch.tensor([prompt.shape[0] + step])
        hidden = llama.decode(torch.tensor([0]), x, position, cache, mode=mode)
    return torch.stack(hiddens), torch.stack(codes)


def run_llamacpp(
    gpt: LlamaCppGPT,
    prompt: torch.Tensor,
    head_code: torch.Tensor,
    emb_code: torch.Tensor,
    forced: torch.Tensor,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `run_mode`, on the llama.cpp backend (sequence 0), fed the reference's codes."""
    num_vq = head_code.shape[0]
    gpt.free_slot(0)
    last, _, _ = gpt.forward([PromptRun(0, prompt, 0)], None)
    hidden = last[0][None]
    hiddens, codes = [], []
    for step in range(steps):
        hiddens.append(hidden[0])
        logits = torch.einsum("bd,qvd->bqv", hidden.float(), head_code)
        codes.append(logits.argmax(-1)[0])
        x = emb_code[torch.arange(num_vq), forced[step]].sum(0, keepdim=True)
        position = prompt.shape[0] + step
        _, out, _ = gpt.forward([], DecodeBatch(torch.tensor([0]), x, torch.tensor([position])))
        assert out is not None
        hidden = out
    gpt.free_slot(0)
    return torch.stack(hiddens), torch.stack(codes)


def llamacpp_rows(
    modules: Any,
    formats: list[str],
    max_tokens: int,
    run: Callable[[LlamaCppGPT], tuple[torch.Tensor, torch.Tensor]],
) -> list[tuple[str, torch.Tensor, torch.Tensor, int, str]]:
    """(format, hidden, codes, GGUF bytes, K/V) per llama.cpp format, or none, saying why."""
    missing = llamacpp_unavailable()
    if missing is not None or not formats:
        print(f"llama.cpp rows skipped: {missing or 'no --gguf-formats'}")
        return []
    shape = LlamaShape.from_config(modules.gpt_config)
    cache = GGUFCache(Path(tempfile.mkdtemp(prefix="bench-quality-gguf-")), "quality")
    theta = float(getattr(modules.gpt_config, "rope_theta", 10000.0))
    out = []
    for fmt in formats:
        path = cache.get(fmt, modules.gpt_state_dict, shape, theta, torch.get_num_threads())
        gpt = LlamaCppGPT(path, shape, 1, max_tokens, max_tokens, torch.get_num_threads(), fmt)
        try:
            hidden, codes = run(gpt)
        finally:
            gpt.close()
        out.append((fmt, hidden, codes, path.stat().st_size, "float32" if fmt == "F32" else "f16"))
    return out


def time_decode(
    llama: LlamaDecoder,
    caches: dict[torch.dtype, SlotKVCache],
    runs: list[tuple[str, str, torch.dtype]],
    batch: int,
    steps: int,
) -> dict[str, float]:
    """Median ms of one decode step of `batch` rows per (label, mode, K/V dtype), in turn."""
    slots = torch.arange(batch)
    max_tokens = next(iter(caches.values())).max_tokens
    positions = torch.full((batch,), min(60, max_tokens - 1))
    x = torch.randn(batch, llama.shape.hidden_size) * 0.1
    for _, mode, kv in runs:
        llama.decode(slots, x, positions, caches[kv], mode=mode)
    times: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for _ in range(steps):
        for label, mode, kv in runs:
            t0 = time.perf_counter()
            llama.decode(slots, x, positions, caches[kv], mode=mode)
            times[label].append((time.perf_counter() - t0) * 1e3)
    return {label: statistics.median(v) for label, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="teacher-forced decode steps")
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--modes", default="", help="comma list (default: every one available)")
    parser.add_argument(
        "--time-batches", default="1,16", help="decode batches to time; empty: none"
    )
    parser.add_argument("--time-steps", type=int, default=8)
    parser.add_argument("--model-dir", default="", help="official assets (default: full dev model)")
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument(
        "--gguf-formats",
        default="F32,F16,Q8_0,Q6_K,Q5_K,Q4_K",
        help="llama.cpp backend rows (GGUF formats; empty: none)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model, 12 steps, temp output")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.prompt_tokens, args.time_steps = 12, 8, 2
        args.out = tempfile.mkdtemp(prefix="bench_quality-")
        model_dir = build_dev_assets("tiny", args.cache)
    else:
        model_dir = Path(args.model_dir) if args.model_dir else build_dev_assets("full", args.cache)

    torch.manual_seed(0)
    device, dtype = torch.device("cpu"), torch.float32
    modules = load_chattts(model_dir, device, dtype)
    modes = args.modes.split(",") if args.modes else modes_for("auto", device, dtype)
    modes = [REFERENCE, *(m for m in modes if m != REFERENCE)]
    llama = LlamaDecoder.from_state_dict(
        modules.gpt_config, modules.gpt_state_dict, device, dtype, modes=modes
    )
    batches = [int(b) for b in args.time_batches.split(",") if b]
    max_tokens = args.prompt_tokens + args.steps + 8
    lossy_kv = served_kv_dtype(llama.shape, device, dtype, lossy=True)
    bf16_kv = lossy_kv == torch.bfloat16
    caches = {
        kv: SlotKVCache(llama.shape, max([1, *batches]), max_tokens, device, kv)
        for kv in {dtype, torch.bfloat16 if bf16_kv else dtype}
    }
    # (label, mode, K/V dtype) per row
    runs = [(m, m, torch.bfloat16 if bf16_kv and not MODES[m].lossless else dtype) for m in modes]
    if bf16_kv:
        runs.insert(1, (f"{REFERENCE} + bf16 K/V", REFERENCE, torch.bfloat16))
    embed = modules.embed
    head_code = torch.stack([h.weight.detach().float() for h in embed.head_code])
    emb_code = torch.stack([e.weight.detach().float() for e in embed.emb_code])
    num_text = embed.emb_text.weight.shape[0]
    prompt_ids = torch.randint(0, num_text, (args.prompt_tokens,))
    prompt = embed.emb_text.weight.detach().float()[prompt_ids]

    rows = []
    with torch.inference_mode():
        ref_hidden, ref_codes = run_mode(
            llama, caches[dtype], REFERENCE, prompt, head_code, emb_code, None, args.steps
        )
        ref_mel = decode_mel(modules.decoder, ref_hidden.T[None].float())
        for label, mode, kv in runs:
            t0 = time.perf_counter()
            hidden, codes = run_mode(
                llama, caches[kv], mode, prompt, head_code, emb_code, ref_codes, args.steps
            )
            mel = decode_mel(modules.decoder, hidden.T[None].float())
            agree = (codes == ref_codes).all(-1).float().mean().item()
            h_snr, m_snr = snr_db(ref_hidden, hidden), snr_db(ref_mel, mel)
            rows.append((label, mode, kv, h_snr, m_snr, agree, llama.weight_bytes(mode)))
            print(
                f"{label:>20}: hidden SNR {h_snr:6.1f} dB, mel SNR {m_snr:6.1f} dB, "
                f"codes agree {100 * agree:5.1f}% ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
        timing = {b: time_decode(llama, caches, runs, b, args.time_steps) for b in batches}
        formats = [f for f in args.gguf_formats.split(",") if f]
        gguf = llamacpp_rows(
            modules,
            formats,
            max_tokens,
            lambda gpt: run_llamacpp(gpt, prompt, head_code, emb_code, ref_codes, args.steps),
        )
        for fmt, hidden, codes, nbytes, kv_name in gguf:
            mel = decode_mel(modules.decoder, hidden.T[None].float())
            agree = (codes == ref_codes).all(-1).float().mean().item()
            h_snr, m_snr = snr_db(ref_hidden, hidden), snr_db(ref_mel, mel)
            rows.append((f"llamacpp {fmt}", "", kv_name, h_snr, m_snr, agree, nbytes))
            print(
                f"{'llamacpp ' + fmt:>20}: hidden SNR {h_snr:6.1f} dB, mel SNR {m_snr:6.1f} dB, "
                f"codes agree {100 * agree:5.1f}%",
                flush=True,
            )

    lines = [
        "# Linear-mode quality budget",
        "",
        f"Model: {'tiny dev (smoke)' if args.smoke else model_dir}; {args.prompt_tokens}-token "
        f"prompt, {args.steps} teacher-forced decode steps at batch 1, every mode fed fp32's "
        f"greedy codes. Budget: hidden-state SNR >= {BUDGET_DB:g} dB (what `--quantize auto` "
        f"allows). Load average {os.getloadavg()[0]:.1f} (the modes are timed in turn: "
        f"compare ms within a column). Command: `python {' '.join(sys.argv)}`",
        "",
        "| mode | family | K/V | hidden SNR dB | mel SNR dB | greedy codes = fp32 | within budget "
        "| weights MiB |" + "".join(f" decode B={b} ms |" for b in batches),
        "|---" * (8 + len(batches)) + "|",
    ]
    for label, mode, kv, h_snr, m_snr, agree, nbytes in rows:
        ok = "yes" if h_snr >= BUDGET_DB else "no"
        cells = "".join(
            f" {timing[b][label]:.1f} |" if label in timing[b] else " - |" for b in batches
        )
        kv_name = str(kv).removeprefix("torch.")
        family = MODES[mode].family if mode else "llama.cpp"
        lines.append(
            f"| {label} | {family} | {kv_name} | {h_snr:.1f} | {m_snr:.1f} | {100 * agree:.1f}% "
            f"| {ok} | {nbytes / 2**20:.0f} |{cells}"
        )
    lines += [
        "",
        "SNR is 10 log10(sum ref^2 / sum (x - ref)^2) over all steps; 'inf' means bit-equal. "
        "int8 and int8-onednn quantize the input per call (one scale for the whole batch), so "
        "their error at batch 16 can differ from batch 1's, and so can int8-mixedN's (dynamic "
        "int8 after N bf16 layers); int8-wo and int8-wo-mixedN do not quantize activations. "
        "The weights are random (HF init, normal 0.02): trained weights have outlier channels that per-channel "
        "int8 handles worse, and which layers are most sensitive may differ; the server "
        "re-measures the SNR on the loaded weights at warm-up. The llama.cpp rows are the "
        "`--backend llamacpp` formats on the same weights (GGUF file size as weights; decode "
        "times in decode_step.md, `bench/bench_decode_step.py`).",
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out / 'quality.md'}")


if __name__ == "__main__":
    main()
