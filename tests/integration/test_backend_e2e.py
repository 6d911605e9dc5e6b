"""The GPT through the real server (tiny model): on a CPU llama.cpp serves, in the format the
quality budget chose (or the one `--gguf-format` names), and a restart with the same weights
reads the choice and the GGUF file back; a server whose llama.cpp does not load serves torch
fp32 instead, saying why (`engine/gpt_build.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_client import TTSClient
from chattts_devtools.launcher import launch
from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.engine.llamacpp_gpt import llamacpp_unavailable

TOKENS = 40


def _speak(srv) -> float:  # type: ignore[no-untyped-def]
    srv.wait_serving()
    config = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=TOKENS, max_new_tokens=TOKENS)
    )
    with TTSClient(srv.target) as client:
        stream = client.synthesize("The backend speaks.", config=config, timeout=60)
        for _ in stream:
            pass
    return stream.stats.audio_s


@pytest.mark.skipif(llamacpp_unavailable() is not None, reason=str(llamacpp_unavailable()))
def test_llamacpp_serves_the_format_it_chose_and_a_restart_reads_it_back(
    dev_model_cache: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--gguf-cache-dir", str(tmp_path), "--max-streams", "2"]
    with launch(args, cache=dev_model_cache) as srv:
        assert _speak(srv) > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    first = srv.log_text()
    assert "the smallest within 30 dB of fp32 (hidden-state SNR" in first, first
    [served] = tmp_path.glob("gpt-*.gguf")
    weight_format = served.name.split("-v1-")[1].removesuffix(".gguf")
    assert f"GPT: llamacpp {weight_format}, built in" in first
    with launch(args, cache=dev_model_cache) as srv:
        assert _speak(srv) > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    again = srv.log_text()
    assert (
        f"GGUF format {weight_format} (the smallest within 30 dB of fp32; measured before" in again
    )
    assert "word timing: source estimate (measured before" in again
    assert "GGUF" in again and "written to" not in again, again


@pytest.mark.skipif(llamacpp_unavailable() is not None, reason=str(llamacpp_unavailable()))
def test_a_named_format_serves_without_the_quality_check(
    dev_model_cache: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--gguf-format", "Q8_0", "--gguf-cache-dir", str(tmp_path), "--max-streams", "2"]
    with launch(args, cache=dev_model_cache) as srv:
        assert _speak(srv) > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    log = srv.log_text()
    assert "GPT: llamacpp Q8_0, built in" in log, log
    assert "hidden-state SNR" not in log
    assert [p.name.split("-v1-")[1] for p in tmp_path.glob("gpt-*.gguf")] == ["Q8_0.gguf"]


def test_a_llama_cpp_that_does_not_load_falls_back_to_torch(
    dev_model_cache: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # What a failed or foreign build looks like at import: the shared library does not load.
    broken = tmp_path / "site" / "llama_cpp"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        'raise OSError("libllama.so: cannot open shared object file")\n'
    )
    env = {"PYTHONPATH": str(broken.parent)}
    args = ["--gguf-cache-dir", str(tmp_path / "gguf"), "--max-streams", "2"]
    with launch(args, cache=dev_model_cache, env=env) as srv:
        assert _speak(srv) > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    log = srv.log_text()
    assert (
        "the GPT runs on torch fp32: llama-cpp-python does not load "
        "(OSError: libllama.so: cannot open shared object file)"
    ) in log, log
    assert "GPT: torch, built in" in log
    assert not (tmp_path / "gguf").exists() or not list((tmp_path / "gguf").glob("*.gguf"))
