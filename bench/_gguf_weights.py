"""What the GGUF benchmarks (bench_decode_step.py, bench_quality.py) share: their flags (which
formats, which weights, where their GGUF files are kept, how many threads, where the markdown
goes); the loading those flags describe; llama.cpp contexts over them; and warm-up's quality
probe against torch fp32, by which the server picks `--gguf-format auto`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import CACHE, REPO, arguments
from torch import Tensor

from chattts_server.defaults import GGUF_FORMATS
from chattts_server.devmodel.assets import build_dev_assets
from chattts_server.engine.gpt_build import QUALITY_PROBE, fp32_reference
from chattts_server.engine.llamacpp_gpt import LlamaCppGPT, llamacpp_unavailable
from chattts_server.engine.prompts import PromptBuilder
from chattts_server.engine.utterance import VoiceSpec
from chattts_server.model.gguf_export import GGUFCache
from chattts_server.model.llama_layers import LlamaShape
from chattts_server.model.loader import ChatTTSModules, load_chattts
from chattts_server.model.warmup_cache import snr_db, weights_digest
from chattts_server.threads import cpu_budget, plan_threads

CPU = torch.device("cpu")


def gguf_arguments(doc: str | None, smoke: str, markdown: str) -> argparse.ArgumentParser:
    """--formats, --threads, --model-dir, --cache, --gguf-folder, --markdown (bench/results/
    `markdown` by default; none with --smoke) and --smoke."""
    # fmt: off
    parser = arguments(doc, smoke)
    parser.add_argument("--formats", default=",".join(GGUF_FORMATS), help="GGUF formats")
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp and torch threads (default: what the server would use: OMP_NUM_THREADS or the CPU budget)")
    parser.add_argument("--model-dir", default="", help="official assets (default: full dev)")
    parser.add_argument("--cache", default=str(CACHE), help="dev model assets")
    parser.add_argument("--gguf-folder", default=str(REPO / ".cache" / "gguf"), help="GGUF files, kept by the weights' digest for the next run")
    parser.add_argument("--markdown", default=str(REPO / "bench" / "results" / markdown), help="write the tables here ('': nowhere)")
    # fmt: on
    return parser


@dataclass
class GGUFWeights:
    """The loaded modules and the GPT's GGUF files, one per format, written on first use."""

    model_dir: Path
    modules: ChatTTSModules
    shape: LlamaShape
    rope_theta: float
    files: GGUFCache
    threads: int

    @classmethod
    def load(cls, args: argparse.Namespace) -> GGUFWeights | None:
        """The weights `gguf_arguments`'s flags name (the tiny dev model with --smoke), torch's
        pool sized as the server sizes it; None (said why) where llama.cpp does not load."""
        if (missing := llamacpp_unavailable()) is not None:
            print(f"nothing to measure: {missing}")
            return None
        threads = plan_threads(args.threads or None, cpu_budget(), dict(os.environ)).intra_op
        torch.set_num_threads(threads)
        model_dir = Path(
            args.model_dir or build_dev_assets("tiny" if args.smoke else "full", args.cache)
        )
        modules = load_chattts(model_dir, CPU, torch.float32)
        digest = weights_digest(modules.gpt_state_dict)
        return cls(
            model_dir,
            modules,
            LlamaShape.from_config(modules.gpt_config),
            float(getattr(modules.gpt_config, "rope_theta", 10000.0)),
            GGUFCache(Path(args.gguf_folder), digest),
            threads,
        )

    def llamacpp(
        self, weight_format: str, num_slots: int, max_tokens: int, batch: int, tap: bool = False
    ) -> LlamaCppGPT:
        """A llama.cpp context of `weight_format` (`batch`: tokens per llama.cpp batch), its
        GGUF file written first if need be."""
        sd, threads = self.modules.gpt_state_dict, self.threads
        path = self.files.get(weight_format, sd, self.shape, self.rope_theta, threads)
        return LlamaCppGPT(
            path, self.shape, num_slots, max_tokens, batch, threads, weight_format, tap
        )

    def describe(self, smoke: bool) -> str:
        where = "tiny dev (smoke)" if smoke else self.model_dir
        return f"{where} ({self.shape.num_layers} layers, hidden {self.shape.hidden_size})"


class Probe:
    """Warm-up's quality probe (gpt_build.QUALITY_PROBE) and its hidden states in torch fp32,
    which each format's are held against ('auto': the smallest format within MIN_SNR_DB)."""

    def __init__(self, weights: GGUFWeights) -> None:
        prompts = PromptBuilder(weights.modules, CPU)
        text = prompts.normalize(QUALITY_PROBE)
        self.embeds = prompts.code_prompt(text, VoiceSpec(), 5).embeds.float()
        self.reference = fp32_reference(weights.modules, self.embeds)

    def snr_db(self, gpt: LlamaCppGPT) -> float:
        return snr_db(self.reference, gpt.hidden_states(0, self.embeds))


def embeds(tokens: int, hidden_size: int) -> Tensor:
    return 0.02 * torch.randn(tokens, hidden_size)  # the scale of ChatTTS's text embeddings
