"""Decoder + vocoder on the CPU: ways to compute them, side by side, in the server's streaming path.

Per generated token the server runs ChatTTS's Decoder and Vocos chunk by chunk with per-layer
state (`StreamingDecoder.step` over every stream, one Decoder and one vocoder call per step). Each
candidate (bench/_decoder_vocoder_candidates.py: torch fp32 as today, fewer threads, oneDNN's
implicit bf16, bf16 or int8 pointwise weights in torch, ONNX Runtime fp32 and int8, ggml Q8_0)
changes only how the ConvNeXt blocks' pointwise MLPs are computed, and runs through the server's
own StreamingDecoder unchanged. For each:

- SNR of its streamed audio against torch fp32's, same schedule (the defaults: first chunk 8,
  lookahead 8, crossfaded seams), one stream alone and the worst of --streams' largest batch;
- exact mode (left context and lookahead = the receptive field): the largest difference between
  its streamed audio, --exact-streams streams batched, and its own offline decode of each
  stream; the tests hold fp32 to 1e-4 (tests/model/test_streaming_decode.py, EXACT_TOL). A
  candidate whose frames share a quantization scale across a call fails this: a frame's output
  then depends on the other frames (chunks, other streams) in the call;
- ms per generated token (Decoder + vocoder, `step` and `finish`) with 1 and 16 streams started
  one step apart and stepped together, one token each per step, as bench_lookahead.py's serving
  load: the minimum of --repeats rounds after a warm-up round (which gives the audio), every
  candidate in turn within a round, so load on a shared machine hits them alike; the 1-minute
  load average is printed beside every figure.

SNR budget: every SNR above >= MIN_SNR_DB (30 dB, the GPT's budget in defaults.py), exact mode's
included; the exact-mode guarantee as the tests pin it is a separate column (<= 1e-4). Random dev weights only approximate how real ones spread quantization
error: rerun with --model-dir on the real assets before trusting the SNR columns. Writes
<out>/decoder_vocoder.md. ONNX Runtime is not a server dependency: its rows run where it is
importable (`uv sync --locked --extra server --extra dev --extra bench-runtimes`) and say
"skipped" otherwise.

Usage: python bench/bench_decoder_vocoder.py [--tokens 200] [--streams 1,16] [--repeats 3]
       [--exact-streams 4] [--candidates fp32,int8-dynamic,...] [--threads N]
       [--model-dir DIR] [--out bench/results]
       python bench/bench_decoder_vocoder.py --smoke   # tiny dev model, 24 tokens, a temp dir
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

from chattts_server.threads import configure_threads  # noqa: E402

# Before torch loads: libgomp reads the server's spin setting once (threads.py says why).
configure_threads(1 if "--smoke" in sys.argv else None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _decoder_vocoder_candidates import Candidate, candidates  # noqa: E402
from bench_lookahead import hidden_walk, snr_db  # noqa: E402

from chattts_server.defaults import MIN_SNR_DB  # noqa: E402
from chattts_server.engine.chunking import ChunkSchedule  # noqa: E402
from chattts_server.engine.streaming_decode import StreamingDecoder  # noqa: E402
from chattts_server.model.mel_decoder import decode_mel  # noqa: E402
from chattts_server.model.vocos import VocosVocoder  # noqa: E402

EXACT_TOL = 1e-4  # tests/model/test_streaming_decode.py: exact mode vs offline, max abs


@dataclass
class Result:
    candidate: Candidate
    skipped: str = ""  # why the row did not run
    snr_db: dict[int, float] = field(default_factory=dict)  # streams -> worst stream's SNR
    exact_err: float = float("nan")  # max abs, exact mode streamed vs its own offline
    exact_snr_db: float = float("nan")
    ms: dict[int, float] = field(default_factory=dict)  # streams -> best ms per token
    load: dict[int, float] = field(default_factory=dict)  # streams -> load average at best

    @property
    def within_budget(self) -> bool:
        return min([*self.snr_db.values(), self.exact_snr_db]) >= MIN_SNR_DB

    @property
    def keeps_exact(self) -> bool:
        return self.exact_err <= EXACT_TOL


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def serve(
    sd: StreamingDecoder, inputs: list[torch.Tensor], config: ChunkSchedule
) -> tuple[float, list[np.ndarray]]:
    """Streams started one step apart, one token each per step, all stepped together (as the
    runner does): Decoder + vocoder ms per generated token, and each stream's audio."""
    streams = [sd.open(config) for _ in inputs]
    parts: list[list[np.ndarray]] = [[] for _ in inputs]
    num_tokens, total_s = len(inputs[0]), 0.0
    for step in range(num_tokens + len(inputs) - 1):
        live = {}
        for i, (stream, hiddens) in enumerate(zip(streams, inputs, strict=True)):
            if 0 <= step - i < num_tokens:
                stream.push(hiddens[step - i : step - i + 1])
                live[i] = stream
        ended = {i: s for i, s in live.items() if step - i == num_tokens - 1}
        t0 = time.perf_counter()
        out = sd.step({i: s for i, s in live.items() if i not in ended})
        out.update(sd.finish(ended))
        total_s += time.perf_counter() - t0
        for i, pcm in out.items():
            parts[i].append(pcm)
    audio = [np.concatenate(p) if p else np.zeros(0, np.float32) for p in parts]
    return 1000.0 * total_s / (len(inputs) * num_tokens), audio


def offline(decoder: torch.nn.Module, vocoder: VocosVocoder, hiddens: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return vocoder.decode(decode_mel(decoder, hiddens.T[None].contiguous()))[0].numpy()


def load_model(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.nn.Module, str]:
    from chattts_server.devmodel.assets import build_dev_assets
    from chattts_server.model.loader import load_chattts

    if args.model_dir:
        model_dir, weights = Path(args.model_dir), f"real assets from {args.model_dir}"
    else:
        variant = "tiny" if args.smoke else "full"
        model_dir = build_dev_assets(variant, Path(args.cache))
        weights = f"the {variant} dev model (random weights)"
    modules = load_chattts(model_dir, torch.device("cpu"), torch.float32)
    return modules.decoder, modules.vocos, weights


def measure(args: argparse.Namespace) -> tuple[list[Result], str, str]:
    decoder, vocos, weights = load_model(args)
    width = 2 * decoder.decoder.conv_in[0].in_channels
    inputs = [hidden_walk(args.tokens, width, seed=100 + i) for i in range(max(args.streams))]
    chosen = [c for c in candidates(torch.get_num_threads()) if c.name in args.candidates]
    results, built = [], {}
    for c in chosen:
        result = Result(c)
        if c.needs and importlib.util.find_spec(c.needs) is None:
            result.skipped = f"{c.needs} not installed"
        else:
            try:
                built[c.name] = c.modules(decoder, vocos)
            except Exception as exc:  # a runtime that cannot take these modules: say why
                result.skipped = f"{type(exc).__name__}: {exc}"[:120]
        if result.skipped:
            print(f"{c.name}: skipped ({result.skipped})", flush=True)
        results.append(result)
    ran = [r for r in results if not r.skipped]

    # Exact mode: each candidate's streams, batched, against its own offline decode.
    probe = StreamingDecoder(decoder, VocosVocoder(vocos))
    exact = replace(ChunkSchedule(), lookahead_tokens=probe.receptive_field_tokens[1])
    exact_inputs = inputs[: args.exact_streams] or inputs[:1]
    for r in ran:
        dec, voc = built[r.candidate.name]
        vocoder = VocosVocoder(voc)
        with r.candidate.running():
            _, streamed = serve(StreamingDecoder(dec, vocoder), exact_inputs, exact)
            refs = [offline(dec, vocoder, h) for h in exact_inputs]
        r.exact_err = max(float(np.abs(a - b).max()) for a, b in zip(streamed, refs, strict=True))
        r.exact_snr_db = min(snr_db(a, b) for a, b in zip(streamed, refs, strict=True))
        print(
            f"{r.candidate.name}: exact mode vs its offline decode, {len(exact_inputs)} streams: "
            f"max abs {r.exact_err:.1e}, SNR {r.exact_snr_db:.1f} dB  [load {load_avg()}]",
            flush=True,
        )

    # Serving load, every candidate in turn per round; round 0 warms up and gives the audio.
    config = ChunkSchedule()
    reference: dict[int, list[np.ndarray]] = {}
    for round_index in range(args.repeats + 1):
        for num in args.streams:
            for r in ran:
                dec, voc = built[r.candidate.name]
                sd = StreamingDecoder(dec, VocosVocoder(voc))
                with r.candidate.running():
                    ms, audio = serve(sd, inputs[:num], config)
                load = os.getloadavg()[0]
                if round_index == 0:
                    reference.setdefault(num, audio)  # fp32 runs first
                    r.snr_db[num] = min(
                        snr_db(a, b) for a, b in zip(audio, reference[num], strict=True)
                    )
                elif ms < r.ms.get(num, float("inf")):
                    r.ms[num], r.load[num] = ms, load
                tag = "warm-up" if round_index == 0 else f"round {round_index}"
                print(
                    f"{tag} {r.candidate.name:13s} {num:2d} streams: {ms:7.3f} ms/token  "
                    f"SNR {r.snr_db[num]:6.1f} dB  [load {load_avg()}]",
                    flush=True,
                )
    return results, weights, str(exact)


def table(results: list[Result], streams: list[int]) -> str:
    base = results[0].ms if results and results[0].candidate.name == "fp32" else {}
    heads = [f"SNR vs fp32, {n} stream{'s' * (n > 1)} (dB)" for n in streams]
    heads += ["exact mode vs own offline: max abs / SNR (dB)", "SNR budget", "exact <= 1e-4"]
    heads += [f"ms/token, {n} stream{'s' * (n > 1)} (load)" for n in streams]
    heads += [f"x fp32, {n}" for n in streams if base]
    lines = [
        "| candidate | what | " + " | ".join(heads) + " |",
        "|---|---|" + "---:|" * len(heads),
    ]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.candidate.name} | {r.candidate.what} | skipped: {r.skipped} |")
            continue
        cells = [_db(r.snr_db[n]) for n in streams]
        cells += [f"{r.exact_err:.1e} / {_db(r.exact_snr_db)}"]
        cells += ["yes" if ok else "**no**" for ok in (r.within_budget, r.keeps_exact)]
        cells += [f"{r.ms[n]:.3f} ({r.load[n]:.1f})" if n in r.ms else "-" for n in streams]
        cells += [f"{base[n] / r.ms[n]:.2f}" if n in r.ms else "-" for n in streams if base]
        lines.append(f"| {r.candidate.name} | {r.candidate.what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(results: list[Result], streams: list[int]) -> str:
    """One line: the fastest candidate within the SNR budget at the largest batch timed, and
    which candidates keep exact mode within the tests' tolerance."""
    ran = [r for r in results if not r.skipped]
    exact = ", ".join(r.candidate.name for r in ran if r.keeps_exact)
    timed = [r for r in ran if r.within_budget and r.ms]
    if not timed:
        return f"RESULT: nothing timed; exact mode <= {EXACT_TOL:g}: {exact}"
    n = max(streams)
    best = min(timed, key=lambda r: r.ms[n])
    return (
        f"RESULT: fastest within {MIN_SNR_DB:g} dB at {n} streams: {best.candidate.name} "
        f"{best.ms[n]:.3f} ms/token ({ran[0].ms[n] / best.ms[n]:.2f}x fp32); exact mode "
        f"<= {EXACT_TOL:g}: {exact}"
    )


def _db(value: float) -> str:
    return ">= 120" if value >= 120 else f"{value:.1f}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = load_avg()
    results, weights, exact = measure(args)
    text = table(results, args.streams)
    print(text)
    print(summary(results, args.streams))
    if not args.repeats:
        return
    command = "python bench/bench_decoder_vocoder.py " + shlex.join(sys.argv[1:])
    header = (
        "# Decoder + vocoder on the CPU: candidates side by side\n\n"
        f"`{command.strip()}` on {cpu_model()} ({os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads). Weights: {weights}. {args.tokens} tokens of AR(1) "
        f"hidden states per stream. Load average (1, 5, 15 min) {load_before} at the start, "
        f"{load_avg()} at the end; the figure in brackets is the 1-minute load at the best run.\n\n"
        f"SNR: the candidate's streamed audio against torch fp32's under the default schedule, "
        f"worst stream. Exact mode ({exact}): its streams, {args.exact_streams} batched, "
        f"against its own offline decode (the tests allow {EXACT_TOL:g} max abs for fp32). SNR "
        f"budget: every SNR here >= {MIN_SNR_DB:g} dB. ms/token: "
        f"Decoder + vocoder per generated token, streams started one step apart and stepped "
        f"together, minimum of {args.repeats} rounds, candidates in turn.\n\n"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decoder_vocoder.md").write_text(header + text + "\n")
    print(f"wrote {out / 'decoder_vocoder.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200, help="tokens per stream (%(default)s)")
    parser.add_argument(
        "--streams", default="1,16", help="stream counts timed, comma list (%(default)s)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed rounds after the warm-up, min taken; 0: quality only, no file (%(default)s)",
    )
    parser.add_argument(
        "--exact-streams",
        type=int,
        default=4,
        help="streams batched in the exact-mode check (%(default)s)",
    )
    parser.add_argument(
        "--candidates",
        default=",".join(c.name for c in candidates(1)),
        help="comma list, fp32 first (%(default)s)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (the CPU budget)")
    parser.add_argument("--model-dir", default=None, help="real ChatTTS assets instead of dev")
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--out", default=None, help="folder for decoder_vocoder.md")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: tiny dev model, 24 tokens, 1 and 2 streams, 1 round; a temp dir unless --out",
    )
    args = parser.parse_args()
    args.streams = [int(n) for n in args.streams.split(",") if n]
    args.candidates = args.candidates.split(",")
    if args.candidates[0] != "fp32":
        parser.error("--candidates: fp32 (the reference) comes first")
    if args.smoke:
        args.tokens, args.streams, args.repeats, args.exact_streams = 24, [1, 2], 1, 2
        if args.out is None:
            with tempfile.TemporaryDirectory(prefix="bench-decoder-vocoder-smoke-") as tmp:
                args.out = tmp
                run(args)
            return
    if args.out is None:
        args.out = str(REPO / "bench" / "results")
    run(args)


if __name__ == "__main__":
    main()
