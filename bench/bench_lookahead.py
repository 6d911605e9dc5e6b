"""Lookahead sweep for the streaming decoder: accuracy vs time to first audio.

Full-size ChatTTS Decoder (idim 384, hidden 512, 12 ConvNeXt blocks) and Vocos (dim 512, 8
layers) with random weights, unless --model-dir points at real assets. How far influence
spreads through the receptive field depends on the weights, so accuracy is measured under two
recipes: "dev" (the dev assets': Decoder layer scales 1/12, Vocos's own init) and "strong"
(Decoder layer scales 0.3, Vocos at PyTorch's default init, layer scale 0.5), which spreads it
further; timings do not depend on weight values and use the first. A stream of smooth hidden
states (an AR(1) walk, speech-like rather than white) is pushed one token per engine step; left
context is the receptive field and the lookahead is swept.

Per lookahead: SNR and max abs error of the streamed audio against the offline decode of all
tokens; time to first audio = generation wait (first chunk + lookahead tokens at real time,
21.3 ms a token) + decode of the first chunk; mean decode ms per chunk; the most tokens one
Decoder call read for the stream. Then the server's short first chunk against a first chunk
like the others (SNR over the whole stream and over its first 16 tokens). Writes lookahead.md
into --out (bench/results). Random weights only approximate real ones: rerun with --model-dir
before trusting the SNR columns.

Usage: python bench/bench_lookahead.py [--tokens 200] [--lookaheads 0,1,2,4,8,12,16,24,32,52]
       [--repeats 3] [--threads N] [--recipes dev,strong | --model-dir DIR]
       python bench/bench_lookahead.py --smoke   # tiny dev model, 24 tokens, into a temp dir
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import CACHE, REPO, arguments, command, load_line, table, write_result

from chattts_devtools.decode_probe import DecodeProbe
from chattts_server.config import EngineConfig
from chattts_server.engine.chunking import ChunkSchedule
from chattts_server.engine.streaming_decode import StreamingDecoder
from chattts_server.model.vocos import VocosVocoder

MS_PER_TOKEN = 1000.0 * 256 * 2 / 24000  # one GPT step of audio: 21.33 ms
SNR_CAP_DB = 120.0  # above this the stream is exact up to fp32 rounding
HEAD_TOKENS = 16  # the first-chunk table's local SNR: where the shorter first chunk's seam lies


def build_modules(model_dir: str | None, recipe: str = "dev") -> tuple[Any, Any]:
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
    scale = {"dev": 1.0 / config.decoder.n_layer, "strong": 0.3}[recipe]
    for block in decoder.modules():
        if isinstance(block, ConvNeXtBlock) and block.weight is not None:
            block.weight.data.fill_(scale)
    if recipe == "strong":
        for module in vocos.backbone.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.Linear)):
                module.reset_parameters()
        for block in vocos.backbone.convnext:
            block.gamma.data.fill_(0.5)
    return decoder.eval(), vocos.eval()


def hidden_walk(num_tokens: int, width: int, seed: int = 0) -> torch.Tensor:
    noise = torch.randn(num_tokens, width, generator=torch.Generator().manual_seed(seed))
    out, state = torch.empty_like(noise), torch.zeros(width)
    for t in range(num_tokens):
        state = 0.9 * state + 0.45 * noise[t]
        out[t] = state
    return out


class Recipe:
    """One set of weights: its streaming decoder (counted by a probe) and offline reference."""

    def __init__(self, name: str, modules: tuple[Any, Any], hiddens: torch.Tensor) -> None:
        decoder, vocos = modules
        self.name, self.sd = name, StreamingDecoder(decoder, VocosVocoder(vocos))
        self.probe = DecodeProbe(self.sd)
        with torch.inference_mode():
            self.reference = vocos.decode(decoder(hiddens.T[None].clone()))[0].numpy()

    def stream(self, hiddens: torch.Tensor, config: ChunkSchedule) -> tuple[np.ndarray, list]:
        """Push one token per step: (audio, each chunk's decode ms)."""
        stream, parts, chunk_ms = self.sd.open(config), [], []
        self.probe.max_decoder_tokens = 0
        for t in range(len(hiddens) + 1):
            if t < len(hiddens):
                stream.push(hiddens[t : t + 1])
            t0 = time.perf_counter()
            out = self.sd.step({0: stream}) if t < len(hiddens) else self.sd.finish({0: stream})
            if out and len(out[0]):
                chunk_ms.append(1000.0 * (time.perf_counter() - t0))
                parts.append(out[0])
        return np.concatenate(parts), chunk_ms

    def snr_db(self, audio: np.ndarray, samples: int | None = None) -> float:
        ref, err = self.reference[:samples], audio[:samples] - self.reference[:samples]
        return min(SNR_CAP_DB, 10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-30)))


@dataclass
class Row:
    lookahead: int
    exact: bool
    num_chunks: int
    snr_db: list[float]  # per recipe
    max_abs_err: float  # first recipe
    first_decode_ms: float
    mean_chunk_ms: float
    decoder_tokens: int  # the most tokens one Decoder call read for the stream

    @property
    def wait_ms(self) -> float:
        """(first chunk + lookahead) tokens of generation at real time."""
        return (ChunkSchedule().first_chunk_tokens + self.lookahead) * MS_PER_TOKEN


def sweep(args: Any, recipes: list[Recipe], hiddens: torch.Tensor) -> list[Row]:
    base = recipes[0]
    configs = [replace(args.base, lookahead_tokens=n) for n in args.lookaheads]
    audio, tokens = [], []  # the first runs also warm the kernels
    for config in configs:
        audio.append(base.stream(hiddens, config)[0])
        tokens.append(base.probe.max_decoder_tokens)
    # Timed rounds go over every lookahead in turn, so load on a shared machine hits them alike;
    # per chunk, the least-disturbed round counts.
    timings: list[list[list[float]]] = [[] for _ in configs]
    for _ in range(args.repeats):
        for i, config in enumerate(configs):
            timings[i].append(base.stream(hiddens, config)[1])
    rows = []
    for i, (lookahead, config) in enumerate(zip(args.lookaheads, configs, strict=True)):
        chunk_ms = np.min(np.array(timings[i]), axis=0)
        snrs = [base.snr_db(audio[i])]
        snrs += [r.snr_db(r.stream(hiddens, config)[0]) for r in recipes[1:]]
        err = float(np.abs(audio[i] - base.reference).max())
        exact = base.sd.open(config).exact
        rows.append(
            Row(lookahead, exact, len(chunk_ms), snrs, err, chunk_ms[0], chunk_ms.mean(), tokens[i])
        )
        print(
            f"lookahead {lookahead:3d}: SNR {' / '.join(f'{v:.1f}' for v in snrs)} dB, TTFA "
            f"{rows[-1].wait_ms + chunk_ms[0]:.0f} ms [{load_line()}]",
            flush=True,
        )
    return rows


def first_chunk_table(args: Any, recipes: list[Recipe], hiddens: torch.Tensor) -> str:
    """What the server's first chunk (--first-chunk-tokens, --first-lookahead-tokens: the
    defaults) costs in accuracy against a first chunk like the others, and the GPT steps it
    saves before the first chunk can be decoded."""
    server = ChunkSchedule.from_config(EngineConfig())
    busy = replace(
        args.base,
        first_chunk_tokens=server.first_chunk_tokens,
        first_lookahead_tokens=server.first_lookahead_tokens,
    )
    # Only the first chunk shorter (its lookahead the stream's own); and 8 + 8, the server's
    # first chunk before issue 47.
    shorter_first = replace(busy, first_lookahead_tokens=None)
    before = replace(args.base, first_chunk_tokens=8, first_lookahead_tokens=None)
    head = HEAD_TOKENS * recipes[0].sd.geometry.samples_per_token
    rows = []
    for config in (before, shorter_first, busy):
        first, lookahead = config.first_chunk_tokens, config.lookahead_of(0)
        cells = [first, lookahead, config.lookahead_tokens, first + lookahead]
        for recipe in recipes:
            audio = recipe.stream(hiddens, config)[0]
            cells.append(f"{_db(recipe.snr_db(audio))} / {_db(recipe.snr_db(audio, head))}")
        rows.append(cells)
    header = ["first chunk", "first lookahead", "later lookahead", "steps to first chunk"]
    header += [f"SNR {r.name} (dB, whole / first {HEAD_TOKENS} tok)" for r in recipes]
    return (
        "## The server's shorter first chunk (`--first-chunk-tokens`, "
        "`--first-lookahead-tokens`)\n\nLater chunks keep the stream's own lookahead.\n\n"
        + table(header, rows)
    )


def _db(value: float) -> str:
    return f">= {SNR_CAP_DB:.0f}" if value >= SNR_CAP_DB else f"{value:.1f}"


def sweep_table(rows: list[Row], recipes: list[Recipe]) -> str:
    header = ["lookahead (tokens)", "exact", *(f"SNR {r.name} (dB)" for r in recipes)]
    header += ["max abs err", "lookahead wait (ms)", "first-chunk gen wait (ms)"]
    header += ["first-chunk decode (ms)", "TTFA (ms)", "chunks", "mean decode/chunk (ms)"]
    header += ["Decoder tokens read per call (max)"]
    return table(
        header,
        (
            [r.lookahead, "yes" if r.exact else "no", *(_db(v) for v in r.snr_db)]
            + [f"{r.max_abs_err:.1e}", f"{r.lookahead * MS_PER_TOKEN:.0f}", f"{r.wait_ms:.0f}"]
            + [f"{r.first_decode_ms:.0f}", f"{r.wait_ms + r.first_decode_ms:.0f}", r.num_chunks]
            + [f"{r.mean_chunk_ms:.0f}", r.decoder_tokens]
            for r in rows
        ),
    )


def summary(rows: list[Row]) -> str:
    def smallest(db: float) -> str:
        ok = [r.lookahead for r in rows if min(r.snr_db) >= db]
        return f"{ok[0]} tokens" if ok else "none swept"

    return (
        f"Smallest lookahead with SNR >= 30 dB under every recipe: {smallest(30)}; with >= 55 dB "
        f"(room for trained weights that spread influence further): {smallest(55)}. "
        f"ChunkSchedule default: {ChunkSchedule().lookahead_tokens} tokens."
    )


def run(args: Any, out: Path) -> None:
    torch.set_num_threads(args.threads)
    names = ["tiny dev" if args.smoke else "real"] if args.model_dir else args.recipes.split(",")
    modules = [build_modules(args.model_dir, name) for name in names]
    width = 2 * modules[0][0].decoder.conv_in[0].in_channels
    hiddens = hidden_walk(args.tokens, width)
    recipes = [Recipe(name, m, hiddens) for name, m in zip(names, modules, strict=True)]
    left, right = recipes[0].sd.receptive_field_tokens
    args.base = base = replace(ChunkSchedule(), left_context_tokens=left)
    rows = sweep(args, recipes, hiddens)
    text = (
        f"# Streaming decode: lookahead sweep\n\nCommand: {command()}, {args.threads} torch "
        f"threads, fp32. Weights: {args.model_dir or 'random, recipes ' + args.recipes}. "
        f"{args.tokens} tokens of AR(1) hidden states pushed one per step; chunks "
        f"{base.schedule(args.tokens)}; left context {left} tokens (the receptive field, "
        f"({left}, {right}) tokens); crossfade {base.crossfade_samples} samples when not exact. "
        f"TTFA = first-chunk generation wait at real time + first-chunk decode (the least of the "
        f"repeats per chunk; absolute values vary between machines and with load).\n\n"
        f"{sweep_table(rows, recipes)}\n\n{summary(rows)}\n\n"
        f"{first_chunk_table(args, recipes, hiddens)}\n"
    )
    print(text)
    write_result(out / "lookahead.md", text)


def main() -> None:
    parser = arguments(__doc__, "tiny dev model, 24 tokens, 1 thread; a temp dir")
    parser.add_argument("--tokens", type=int, default=200, help="tokens streamed per run")
    parser.add_argument("--lookaheads", default="0,1,2,4,8,12,16,24,32,52", help="swept")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, least taken")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch's")
    parser.add_argument("--recipes", default="dev,strong", help="random-weight recipes")
    parser.add_argument("--model-dir", default=None, help="real ChatTTS assets instead")
    parser.add_argument("--out", default=None, help="folder for lookahead.md (bench/results)")
    args = parser.parse_args()
    args.lookaheads = [int(v) for v in args.lookaheads.split(",")]
    if args.smoke:
        from chattts_server.devmodel.assets import build_dev_assets

        args.model_dir = str(build_dev_assets("tiny", CACHE))
        args.tokens, args.lookaheads, args.repeats = 24, [0, 4], 1
        args.threads = 1  # on a busy machine, spinning OpenMP workers made chunks 100x slower
        if args.out is None:
            with tempfile.TemporaryDirectory(prefix="bench-lookahead-smoke-") as tmp:
                run(args, Path(tmp))
            return
    run(args, Path(args.out or REPO / "bench" / "results"))


if __name__ == "__main__":
    main()
