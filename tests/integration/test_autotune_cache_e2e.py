"""The CPU default `--quantize auto` through the real server (subprocess, tiny model): the first
start times the linear modes and stores the answer; a restart on the same machine, weights,
threads and torch reuses it (its log says so) and still speaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chattts_client import TTSClient
from chattts_devtools.launcher import launch
from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.model.linear_modes import modes_for

ARGS = ["--max-streams", "2", "--threads", "1"]


def _start_and_speak(cache: Path, folder: Path) -> str:
    args = [*ARGS, "--autotune-cache-dir", str(folder)]  # no --quantize: the default
    with launch(args, cache=cache) as srv:
        srv.wait_serving()
        config = tts_pb2.SynthesisConfig(
            sampling=tts_pb2.Sampling(seed=3, min_new_tokens=20, max_new_tokens=20)
        )
        with TTSClient(srv.target) as client:
            stream = client.synthesize("Twice.", config=config, timeout=60)
            for _ in stream:
                pass
        assert stream.stats.audio_s > 0
        assert srv.stop() == 0
    return srv.log_text()


def test_a_restart_reuses_the_autotune_result(
    dev_model_cache: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    if len(modes_for("auto", torch.device("cpu"), torch.float32)) < 2:
        pytest.skip("one linear mode on this CPU: nothing timed, nothing to reuse")
    folder = tmp_path / "autotune"
    first = _start_and_speak(dev_model_cache, folder)
    assert "linear-mode autotune (--quantize auto, " in first
    [entry] = folder.glob("autotune-*.json")
    assert f"autotune result stored in {entry}" in first
    second = _start_and_speak(dev_model_cache, folder)
    assert f"linear-mode autotune (--quantize auto, reused {entry}" in second
    assert "autotune result stored in" not in second
