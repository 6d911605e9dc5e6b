"""The GPT backend through the real server (tiny model): llama.cpp serves a stream, and a server
whose llama.cpp does not load serves torch instead, saying why (`engine/backend_choice.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_client import TTSClient
from chattts_devtools.launcher import launch
from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.engine.backend_choice import llamacpp_unavailable

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
def test_llamacpp_serves_a_stream(dev_model_cache: Path, tiny_model_dir: Path, tmp_path: Path):
    args = ["--backend", "llamacpp", "--gguf-format", "Q8_0", "--gguf-cache-dir", str(tmp_path)]
    with launch([*args, "--max-streams", "2"], cache=dev_model_cache) as srv:
        assert _speak(srv) > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    log = srv.log_text()
    assert "GPT backend: llamacpp Q8_0" in log, log
    assert "alignment heads: not calibrated (llamacpp Q8_0 returns no attention)" in log
    assert list(tmp_path.glob("gpt-*-Q8_0.gguf"))


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
    args = ["--backend", "llamacpp", "--gguf-cache-dir", str(tmp_path / "gguf")]
    with launch([*args, "--max-streams", "2"], cache=dev_model_cache, env=env) as srv:
        assert _speak(srv) > 0.9 * TOKENS / 46.875
        assert srv.stop() == 0
    log = srv.log_text()
    assert (
        "--backend llamacpp: serving torch; llama-cpp-python does not load "
        "(OSError: libllama.so: cannot open shared object file)"
    ) in log, log
    assert "GPT backend: llamacpp" not in log
