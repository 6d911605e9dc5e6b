"""Generation under each --quantize mode, end to end through the real server (tiny model): the
model loads once with the mode's weights (their size logged), warm-up autotunes and logs its
table, and a request streams audio."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chattts_client import TTSClient
from chattts_devtools.launcher import launch
from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.model.linear_modes import MODES, modes_for

TOKENS = 40


@pytest.mark.parametrize("quantize", ["none", "bf16", "int8", "auto"])
def test_generation_under_each_mode(
    quantize: str, dev_model_cache: Path, tiny_model_dir: Path
) -> None:
    import torch

    try:
        allowed = modes_for(quantize, torch.device("cpu"), torch.float32)
    except ValueError:
        pytest.skip(f"no {quantize} kernel on this CPU")
    args = ["--quantize", quantize, "--max-streams", "2", "--threads", "1"]
    with launch(args, cache=dev_model_cache) as srv:
        srv.wait_serving()
        config = tts_pb2.SynthesisConfig(
            sampling=tts_pb2.Sampling(seed=3, min_new_tokens=TOKENS, max_new_tokens=TOKENS)
        )
        with TTSClient(srv.target) as client:
            stream = client.synthesize("Each mode speaks.", config=config, timeout=60)
            for _ in stream:
                pass
        assert stream.stats.audio_s > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    log = srv.log_text()
    sizes = re.search(rf"GPT linear weights \({quantize}\): (.*)", log)
    assert sizes, log
    assert [m.split()[0] for m in sizes.group(1).split(", ")] == sorted(
        allowed, key=lambda m: (m != "dense-onednn", allowed.index(m))
    )
    start = log.index(f"linear-mode autotune (--quantize {quantize}")
    table = log[start : log.index("warm-up (decode batches", start)]
    chosen = re.findall(r"^\s*(\d+) (?:.* ms)?\s+(\S+)$", table, re.MULTILINE)
    assert [int(b) for b, _ in chosen] == [1, 2]
    assert all(mode in allowed for _, mode in chosen)
    if quantize in ("bf16", "int8"):
        assert all(MODES[mode].family == quantize for _, mode in chosen)
