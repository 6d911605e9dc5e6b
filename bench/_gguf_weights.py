"""The GPT's weights as the GGUF benchmarks load them (bench_decode_step.py, bench_quality.py):
the flags that say which weights, where their GGUF files are kept and how many threads run them,
and the loading those flags describe."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from chattts_server.devmodel.assets import build_dev_assets
from chattts_server.model.gguf_export import GGUFCache
from chattts_server.model.llama_layers import LlamaShape
from chattts_server.model.loader import ChatTTSModules, load_chattts
from chattts_server.model.warmup_cache import weights_digest
from chattts_server.threads import cpu_budget, plan_threads

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def add_weight_arguments(parser: argparse.ArgumentParser) -> None:
    """--threads, --model-dir, --cache and --gguf-folder."""
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp and torch threads (default: what the server would use: "
        "OMP_NUM_THREADS or the CPU budget)",
    )
    parser.add_argument("--model-dir", default="", help="official assets (default: full dev)")
    parser.add_argument(
        "--cache", default=str(REPO / ".cache" / "dev-models"), help="dev model assets"
    )
    parser.add_argument(
        "--gguf-folder",
        default=str(REPO / ".cache" / "gguf"),
        help="GGUF files, kept by the weights' digest for the next run",
    )


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
    def load(cls, args: argparse.Namespace) -> GGUFWeights:
        """The weights `add_weight_arguments`'s flags name (the tiny dev model with --smoke),
        torch's pool sized as the server sizes it."""
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

    def path(self, weight_format: str) -> Path:
        """The GGUF file of `weight_format`, written now if need be."""
        sd = self.modules.gpt_state_dict
        return self.files.get(weight_format, sd, self.shape, self.rope_theta, self.threads)
