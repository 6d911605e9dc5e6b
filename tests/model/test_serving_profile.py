"""bench/serving_profile (the per-token cost table of bench/bench_serving.py) times the GPT step
on both of its paths: `LlamaDecoder.forward_batch` (the engine step's one forward), and
`DecodeGraphs` (CUDA graphs on, whose replays the decode rows go through; with an empty GPT row
the GPU table was silently empty).

The hook runs for real: a subprocess with bench/serving_profile first on its path imports it as
`sitecustomize`, it installs itself when thread pools are sized, and the engine then decodes
the tiny model both ways: without graphs, and through the graphs' padded static path (eager on
the CPU, the same Python entry CUDA replays go through).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import sitecustomize  # bench/serving_profile's hook, first on the path
    import chattts_server.threads as threads
    threads.configure_threads(1)  # the hook installs itself here, as in the server
    import torch
    from chattts_server.config import EngineConfig
    from chattts_server.engine.core import EngineCore
    from chattts_server.engine.utterance import SamplingParams, UtteranceRequest, VoiceSpec
    from chattts_server.model.loader import load_chattts
    from engine_run import run_core, torch_runner

    model_dir, profile, graphs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    config = EngineConfig(max_streams=2, max_tokens=256, max_new_tokens=32)
    modules = load_chattts(model_dir, torch.device("cpu"), torch.float32)
    runner = torch_runner(modules, config, decode_graphs=graphs)
    runner.warmup(config.max_streams)
    sitecustomize.write_profile()  # a snapshot now, not the daemon's next one
    before = json.loads(profile.read_text())
    requests = [
        UtteranceRequest(f"r{i}", "one sentence.", voice=VoiceSpec(),
                         sampling=SamplingParams(top_k=1, min_new_tokens=n, max_new_tokens=n))
        for i, n in enumerate((20, 12))
    ]
    results = run_core(EngineCore.from_config(runner, config), {0: requests})
    sitecustomize.write_profile()
    after = json.loads(profile.read_text())
    diff = {k: [a - b for a, b in zip(v, before.get(k, [0, 0]))] for k, v in after.items()}
    print(json.dumps(diff))
    """
)


def _profile_diff(tiny_model_dir, tmp_path, graphs: str) -> dict[str, list[float]]:
    profile = tmp_path / "profile.json"
    paths = [
        REPO / "bench" / "serving_profile",
        *(REPO / d for d in ("client", "server", "tools", "tests/helpers")),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, paths)),
        "CHATTTS_PROFILE_OUT": str(profile),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_dir), str(profile), graphs],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# 20 + 12 tokens: each request's first comes from its prefill, the rest from decode rows.
DECODE_ROWS = (20 - 1) + (12 - 1)


def test_the_profile_times_and_counts_the_one_forward_of_each_step(tiny_model_dir, tmp_path):
    diff = _profile_diff(tiny_model_dir, tmp_path, "off")
    assert diff["decode_rows"][0] == DECODE_ROWS
    assert diff["gpt_forward"][1] > 0 and diff["gpt_forward"][0] > 0  # calls, s
    assert diff.get("gpt_decode_graphs", [0, 0])[1] == 0


def test_the_profile_times_and_counts_decode_through_the_graphs_path(tiny_model_dir, tmp_path):
    diff = _profile_diff(tiny_model_dir, tmp_path, "eager")
    assert diff["decode_rows"][0] == DECODE_ROWS
    assert diff["gpt_decode_graphs"][1] > 0 and diff["gpt_decode_graphs"][0] > 0  # calls, s
    assert diff["gpt_decode"][1] == 0  # the graphs' path never calls LlamaDecoder.decode
