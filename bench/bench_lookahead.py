"""Lookahead sweep for the streaming decoder: accuracy vs time to first audio.

Full-size ChatTTS Decoder (idim 384, hidden 512, 12 ConvNeXt blocks, bn_dim 128) and Vocos
(dim 512, intermediate 1536, 8 layers) with random weights, unless --model-dir points at a real
asset folder. How far influence spreads through the receptive field depends on the weights, so
accuracy is measured under two recipes: "dev" (the dev assets': Decoder layer scales 1/12,
Vocos's own init, trunc-normal 0.02 and layer scale 1/8) and "strong" (Decoder layer scales 0.3,
Vocos convs and linears at PyTorch's default init, layer scale 0.5), which spreads influence
further; timings do not depend on weight values and use the first recipe. A 200-token
stream of smooth hidden states (an AR(1) random walk, speech-like rather than white) is pushed
one token per engine step; left context is fixed at the receptive field and the lookahead swept.

For each lookahead: SNR and max abs error of the streamed audio against the offline decode of
all tokens, the largest difference from the window path (`chattts_devtools.window_decoder`,
which re-decodes the left context every chunk), time to first audio = generation wait (first
chunk + lookahead tokens at real time, 21.3 ms per token) + decode of the first chunk, and mean
decode ms per chunk. Then the serving load: --streams streams (default 16) of --tokens tokens
with the default chunking, started one step apart and pushed one token per step, all stepped
together as the engine does; Decoder + vocoder ms per generated token, stateful and window path
alternating in one process (the minimum over --repeats rounds each). Writes
bench/results/lookahead.md and bench/results/lookahead.png.

Random weights only approximate how far real weights spread influence through the receptive
field: rerun with --model-dir on the real assets before trusting the SNR columns.

Usage: python bench/bench_lookahead.py [--tokens 200] [--lookaheads 0,1,2,4,8,12,16,24,32,52]
       [--repeats 3] [--threads N] [--recipes dev,strong | --model-dir DIR] [--streams 16]
       [--out bench/results]
       python bench/bench_lookahead.py --smoke   # tiny dev model, 24 tokens, into a temp dir
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

from chattts_devtools.window_decoder import WindowDecoder  # noqa: E402
from chattts_server.config import EngineConfig  # noqa: E402
from chattts_server.engine.chunking import ChunkSchedule  # noqa: E402
from chattts_server.engine.streaming_decode import StreamingDecoder  # noqa: E402
from chattts_server.model.receptive_field import frames_to_tokens  # noqa: E402
from chattts_server.model.vocos import VocosVocoder  # noqa: E402

MS_PER_TOKEN = 1000.0 * 256 * 2 / 24000  # one GPT step of audio: 21.33 ms
SNR_CAP_DB = 120.0  # above this the stream is exact up to fp32 rounding


def build_modules(
    model_dir: str | None, recipe: str = "dev"
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(Decoder, Vocos) at the official shapes: random weights, or loaded from `model_dir`."""
    if model_dir:
        from chattts_server.model.loader import load_chattts

        modules = load_chattts(model_dir, torch.device("cpu"), torch.float32)
        return modules.decoder, modules.vocos
    from ChatTTS.config import Config
    from ChatTTS.model import DVAE
    from ChatTTS.model.dvae import ConvNeXtBlock

    from chattts_server.model.chattts_config import build_vocos

    torch.manual_seed(0)
    config = Config()
    decoder = DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim)
    vocos = build_vocos(config)
    # ChatTTS initialises layer scales at 1e-6 (blocks ~ identity); dev assets use 1/12.
    scale = 1.0 / config.decoder.n_layer if recipe == "dev" else 0.3
    for block in decoder.modules():
        if isinstance(block, ConvNeXtBlock) and block.weight is not None:
            block.weight.data.fill_(scale)
    if recipe == "strong":
        for module in vocos.backbone.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.Linear)):
                module.reset_parameters()
        for block in vocos.backbone.convnext:
            block.gamma.data.fill_(0.5)
    elif recipe != "dev":
        raise ValueError(f"unknown recipe {recipe!r}")
    return decoder.eval(), vocos.eval()


def hidden_walk(num_tokens: int, width: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(num_tokens, width, generator=gen)
    out, state = torch.empty_like(noise), torch.zeros(width)
    for t in range(num_tokens):
        state = 0.9 * state + 0.45 * noise[t]
        out[t] = state
    return out


@dataclass
class Row:
    lookahead: int
    exact: bool
    num_chunks: int
    snr_db: float  # first recipe (or the real weights)
    max_abs_err: float
    wait_ms: float  # (first chunk + lookahead) tokens of generation at real time
    lookahead_ms: float  # the lookahead's share of wait_ms
    first_decode_ms: float
    mean_chunk_ms: float
    window_tokens: int  # steady-state Decoder window per chunk
    window_path_diff: float  # max abs difference from the window path's audio
    other_snr_db: dict[str, float] = field(default_factory=dict)  # further recipes

    @property
    def ttfa_ms(self) -> float:
        return self.wait_ms + self.first_decode_ms


def stream_once(sd: StreamingDecoder | WindowDecoder, hiddens: torch.Tensor, config: ChunkSchedule):
    """Push one token per step; returns (audio, per-chunk decode ms, steady window tokens)."""
    stream = sd.open(config)
    parts, chunk_ms = [], []
    for t in range(len(hiddens)):
        stream.push(hiddens[t : t + 1])
        t0 = time.perf_counter()
        out = sd.step({0: stream})
        if out:
            chunk_ms.append(1000.0 * (time.perf_counter() - t0))
            parts.append(out[0])
    t0 = time.perf_counter()
    pcm = sd.finish({0: stream})[0]
    if len(pcm):
        chunk_ms.append(1000.0 * (time.perf_counter() - t0))
        parts.append(pcm)
    return np.concatenate(parts), chunk_ms, stream.max_window_tokens


def snr_db(audio: np.ndarray, reference: np.ndarray) -> float:
    err = audio - reference
    return min(SNR_CAP_DB, 10 * np.log10(np.sum(reference**2) / max(np.sum(err**2), 1e-30)))


def offline(decoder: torch.nn.Module, vocos: torch.nn.Module, hiddens: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return vocos.decode(decoder(hiddens.T[None].clone()))[0].numpy()


def sweep(args: argparse.Namespace) -> tuple[list[Row], StreamingDecoder, ChunkSchedule, str]:
    recipes = [None] if args.model_dir else args.recipes
    decoder, vocos = build_modules(args.model_dir, recipes[0] or "dev")
    vocoder = VocosVocoder(vocos)
    sd = StreamingDecoder(decoder, vocoder)
    others = {name: build_modules(None, name) for name in recipes[1:]}
    left, right = sd.receptive_field_tokens
    print(
        f"receptive fields: Decoder {sd.decoder_receptive_field} frames "
        f"{frames_to_tokens(sd.decoder_receptive_field)} tokens; Vocos {vocoder.receptive_field} "
        f"frames; combined ({left}, {right}) tokens"
    )
    hiddens = hidden_walk(args.tokens, 2 * decoder.decoder.conv_in[0].in_channels)
    reference = offline(decoder, vocos, hiddens)
    other_refs = {name: offline(dec, voc, hiddens) for name, (dec, voc) in others.items()}
    base = replace(ChunkSchedule(), left_context_tokens=left)
    configs = [replace(base, lookahead_tokens=lookahead) for lookahead in args.lookaheads]
    first_runs = [stream_once(sd, hiddens, config) for config in configs]  # also warms kernels
    window_sd = WindowDecoder(decoder, vocoder)
    window_audio = [stream_once(window_sd, hiddens, config)[0] for config in configs]
    # Timed rounds go over every lookahead in turn, so load on a shared machine hits them alike;
    # per chunk, the least-disturbed round counts.
    timings: list[list[list[float]]] = [[] for _ in configs]
    for _ in range(args.repeats):
        for i, config in enumerate(configs):
            timings[i].append(stream_once(sd, hiddens, config)[1])
    rows = []
    for lookahead, config, (audio, _, window), runs, reference_path in zip(
        args.lookaheads, configs, first_runs, timings, window_audio, strict=True
    ):
        assert audio.shape == reference.shape, (audio.shape, reference.shape)
        chunk_ms = np.min(np.array(runs), axis=0)
        other_snr = {
            name: snr_db(
                stream_once(StreamingDecoder(dec, VocosVocoder(voc)), hiddens, config)[0],
                other_refs[name],
            )
            for name, (dec, voc) in others.items()
        }
        first = config.first_chunk_tokens
        rows.append(
            Row(
                lookahead=lookahead,
                exact=sd.open(config).exact,
                num_chunks=len(chunk_ms),
                snr_db=snr_db(audio, reference),
                max_abs_err=float(np.abs(audio - reference).max()),
                wait_ms=(first + lookahead) * MS_PER_TOKEN,
                lookahead_ms=lookahead * MS_PER_TOKEN,
                first_decode_ms=float(chunk_ms[0]),
                mean_chunk_ms=float(chunk_ms.mean()),
                window_tokens=window,
                window_path_diff=float(np.abs(audio - reference_path).max()),
                other_snr_db=other_snr,
            )
        )
        r = rows[-1]
        extra = "".join(f" ({name} {v:.1f} dB)" for name, v in r.other_snr_db.items())
        print(
            f"lookahead {lookahead:3d}: SNR {r.snr_db:6.1f} dB{extra}  max err {r.max_abs_err:.2e}  "
            f"TTFA {r.ttfa_ms:6.0f} ms (wait {r.wait_ms:.0f} + decode {r.first_decode_ms:.0f})  "
            f"chunk {r.mean_chunk_ms:.0f} ms  vs window path {r.window_path_diff:.1e}",
            flush=True,
        )
    busy = busy_table(sd, others, hiddens, {None: reference, **other_refs}, base)
    return rows, sd, base, busy


BUSY_HEAD_TOKENS = 16
"""The first-chunk table's local SNR: over the first this many tokens' samples, where the
shorter first chunk's seam lies (a whole-stream SNR would dilute it)."""


def busy_table(
    sd: StreamingDecoder,
    others: dict[str, tuple[torch.nn.Module, torch.nn.Module]],
    hiddens: torch.Tensor,
    references: dict[str | None, np.ndarray],
    base: ChunkSchedule,
) -> str:
    """What the server's first chunk (--first-chunk-tokens, --first-lookahead-tokens: the
    defaults) costs in accuracy against a first chunk like the others, and the GPT steps it
    saves before the first chunk can be decoded."""
    server = ChunkSchedule.from_config(EngineConfig())
    busy = replace(
        base,
        first_chunk_tokens=server.first_chunk_tokens,
        first_lookahead_tokens=server.first_lookahead_tokens,
    )
    # Only the first chunk shorter, its lookahead the stream's own; and 8 + 8, the server's
    # first chunk before issue 47.
    shorter_first = replace(busy, first_lookahead_tokens=None)
    before = replace(base, first_chunk_tokens=8, first_lookahead_tokens=None)
    head = BUSY_HEAD_TOKENS * sd.geometry.samples_per_token
    decoders = {None: sd} | {
        name: StreamingDecoder(dec, VocosVocoder(voc)) for name, (dec, voc) in others.items()
    }
    lines = [
        "| first chunk | first lookahead | later lookahead | steps to first chunk | "
        + " | ".join(
            f"SNR {name or 'first recipe'} (dB, whole / first {BUSY_HEAD_TOKENS} tok)"
            for name in decoders
        )
        + " |",
        "|---|---|---|---|" + "---|" * len(decoders),
    ]
    for config in (before, shorter_first, busy):
        cells = []
        for name, decoder in decoders.items():
            audio, ref = stream_once(decoder, hiddens, config)[0], references[name]
            cells.append(f"{_db(snr_db(audio, ref))} / {_db(snr_db(audio[:head], ref[:head]))}")
        lines.append(
            f"| {config.first_chunk_tokens} | {config.lookahead_of(0)} | "
            f"{config.lookahead_tokens} | {config.first_chunk_tokens + config.lookahead_of(0)} | "
            + " | ".join(cells)
            + " |"
        )
    return (
        "## The server's shorter first chunk (`--first-chunk-tokens`, "
        "`--first-lookahead-tokens`)\n\n"
        "A 4-token first chunk with a 4-token lookahead (the server's defaults); later chunks "
        "keep the stream's own lookahead.\n\n" + "\n".join(lines)
    )


def serving_load(
    sd: StreamingDecoder | WindowDecoder, num_streams: int, num_tokens: int, width: int
) -> tuple[float, int]:
    """Decoder + vocoder ms per token over `num_streams` streams started one step apart and
    stepped together (as the engine's runner does), and the Decoder calls made."""
    inputs = [hidden_walk(num_tokens, width, seed=100 + i) for i in range(num_streams)]
    streams = [sd.open() for _ in inputs]
    calls, total_s = sd.num_decoder_calls, 0.0
    for step in range(num_tokens + num_streams - 1):
        live = {}
        for i, (stream, hiddens) in enumerate(zip(streams, inputs, strict=True)):
            if 0 <= step - i < num_tokens:
                stream.push(hiddens[step - i : step - i + 1])
                live[i] = stream
        ended = {i: streams[i] for i in live if step - i == num_tokens - 1}
        t0 = time.perf_counter()
        sd.step({i: s for i, s in live.items() if i not in ended})
        sd.finish(ended)
        total_s += time.perf_counter() - t0
    return 1000.0 * total_s / (num_streams * num_tokens), sd.num_decoder_calls - calls


def load_table(decoder: torch.nn.Module, vocos: torch.nn.Module, args: argparse.Namespace) -> str:
    width = 2 * decoder.decoder.conv_in[0].in_channels
    paths = {"stateful": StreamingDecoder, "window (before)": WindowDecoder}
    best: dict[str, float] = {}
    calls: dict[str, int] = {}
    for _ in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, decoder_class in paths.items():
            sd = decoder_class(decoder, VocosVocoder(vocos))
            ms, calls[name] = serving_load(sd, args.streams, args.tokens, width)
            if _:
                best[name] = min(best.get(name, ms), ms)
    ratio = best["stateful"] / best["window (before)"]
    lines = [
        f"Serving load: {args.streams} streams x {args.tokens} tokens, default chunking, started "
        "one step apart, stepped together; Decoder + vocoder per generated token, the two paths "
        f"alternating in one process, minimum of {args.repeats} rounds:",
        "",
        "| path | ms per token | Decoder calls |",
        "|---|---:|---:|",
        *(f"| {name} | {best[name]:.3f} | {calls[name]} |" for name in paths),
        "",
        f"stateful / window = {ratio:.2f}",
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _db(value: float) -> str:
    return f">= {SNR_CAP_DB:.0f}" if value >= SNR_CAP_DB else f"{value:.1f}"


def table(rows: list[Row], first_name: str) -> str:
    others = list(rows[0].other_snr_db)
    snr_heads = "".join(f" SNR {name} (dB) |" for name in [first_name, *others])
    lines = [
        f"| lookahead (tokens) | exact |{snr_heads} max abs err | vs window path | "
        "lookahead wait (ms) | first-chunk gen wait (ms) | first-chunk decode (ms) | TTFA (ms) | "
        "chunks | mean decode/chunk (ms) | Decoder tokens read per chunk (max) |",
        "|---:|:---:|" + "---:|" * (len(others) + 1) + "---:|" * 9,
    ]
    for r in rows:
        snr = " | ".join(_db(v) for v in [r.snr_db, *r.other_snr_db.values()])
        lines.append(
            f"| {r.lookahead} | {'yes' if r.exact else 'no'} | {snr} | {r.max_abs_err:.1e} | "
            f"{r.window_path_diff:.1e} | {r.lookahead_ms:.0f} | {r.wait_ms:.0f} | {r.first_decode_ms:.0f} | {r.ttfa_ms:.0f} | "
            f"{r.num_chunks} | {r.mean_chunk_ms:.0f} | {r.window_tokens} |"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    def smallest(db: float) -> str:
        ok = [r.lookahead for r in rows if min([r.snr_db, *r.other_snr_db.values()]) >= db]
        return f"{ok[0]} tokens" if ok else "none swept"

    return (
        f"Smallest lookahead with SNR >= 30 dB under every recipe: {smallest(30)}; with >= 55 dB "
        f"(room for trained weights that spread influence further): {smallest(55)}. "
        f"ChunkSchedule default: {ChunkSchedule().lookahead_tokens} tokens."
    )


def plot(rows: list[Row], first_name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r.lookahead for r in rows]
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(x, [r.snr_db for r in rows], "o-", color="tab:blue", label=f"SNR, {first_name}")
    for name, style in zip(rows[0].other_snr_db, ["^--", "v:"], strict=False):
        ax1.plot(
            x, [r.other_snr_db[name] for r in rows], style, color="tab:blue", label=f"SNR, {name}"
        )
    ax1.legend(loc="center right")
    ax1.axhline(30, color="tab:blue", linestyle=":", linewidth=1)
    ax1.set_xlabel("lookahead (tokens, 21.3 ms each)")
    ax1.set_ylabel("SNR vs offline decode (dB)", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(x, [r.ttfa_ms for r in rows], "s-", color="tab:red", label="time to first audio (ms)")
    ax2.set_ylabel("time to first audio (ms)", color="tab:red")
    ax1.set_title("Streaming decode: accuracy vs time to first audio")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, default=200, help="tokens streamed per run (%(default)s)"
    )
    parser.add_argument(
        "--lookaheads", default="0,1,2,4,8,12,16,24,32,52", help="lookaheads swept (%(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per lookahead, min taken (%(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads (%(default)s)"
    )
    parser.add_argument(
        "--recipes", default="dev,strong", help="random-weight recipes: dev, strong (%(default)s)"
    )
    parser.add_argument("--model-dir", default=None, help="real ChatTTS assets instead of random")
    parser.add_argument(
        "--streams",
        type=int,
        default=16,
        help="streams in the serving-load timing, 0 to skip (%(default)s)",
    )
    parser.add_argument(
        "--out", default=None, help="folder for lookahead.md/png (default: bench/results)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: tiny dev model, 24 tokens, 2 lookaheads, 1 repeat, 1 thread; a temp dir unless --out",
    )
    args = parser.parse_args()
    if args.smoke:
        from chattts_server.devmodel.assets import build_dev_assets

        args.model_dir = str(build_dev_assets("tiny", REPO / ".cache" / "dev-models"))
        args.tokens, args.lookaheads, args.repeats, args.streams = 24, "0,4", 1, 2
        # One thread: on a busy machine, spinning OpenMP workers made chunks 100x slower.
        args.threads = 1
        if args.out is None:
            with tempfile.TemporaryDirectory(prefix="bench-lookahead-smoke-") as tmp:
                args.out = tmp
                run(args)
            return
    run(args)


def run(args: argparse.Namespace) -> None:
    if args.out is None:
        args.out = str(REPO / "bench" / "results")
    args.lookaheads = [int(v) for v in args.lookaheads.split(",")]
    args.recipes = args.recipes.split(",")
    torch.set_num_threads(args.threads)

    rows, sd, base, busy = sweep(args)
    load = ""
    if args.streams:
        decoder, vocos = build_modules(args.model_dir, args.recipes[0])
        load = "\n\n" + load_table(decoder, vocos, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first_name = "tiny dev" if args.smoke else "real" if args.model_dir else args.recipes[0]
    text = table(rows, first_name)
    print(text)
    weights = (
        args.model_dir or f"random, recipes {', '.join(args.recipes)} (see the script's docstring)"
    )
    header = (
        "# Streaming decode: lookahead sweep\n\n"
        f"`python bench/bench_lookahead.py` on {os.cpu_count()} CPU threads "
        f"({args.threads} used), fp32. Weights: {weights}. {args.tokens} tokens of AR(1) hidden "
        f"states pushed one per step; chunks {base.schedule(args.tokens)} "
        f"(first {base.first_chunk_tokens}, growth {base.growth}, cap {base.max_chunk_tokens}); "
        f"left context {base.left_context_tokens} tokens (the receptive field); crossfade "
        f"{base.crossfade_samples} samples when not exact. Receptive field Decoder+Vocos: "
        f"{sd.receptive_field_tokens} tokens.\n\n"
        "TTFA = first-chunk generation wait ((first chunk + lookahead) x 21.3 ms at real time) "
        "+ first-chunk decode. Decode times are the minimum of the repeats per chunk; absolute "
        "values vary between machines and with load.\n\n"
    )
    print(busy)
    (out / "lookahead.md").write_text(
        header + text + "\n\n" + summary(rows) + "\n\n" + busy + load + "\n"
    )
    plot(rows, first_name, out / "lookahead.png")
    print(f"wrote {out / 'lookahead.md'} and {out / 'lookahead.png'}")


if __name__ == "__main__":
    main()
