"""`--model` serving: the tiny model fetched from a local imitation of the hub
(tests/helpers/fake_hub.py) is what the server loads and speaks with, and a second run serves
it from the cache with the hub gone. `make run`'s command falls back to the dev model with one
line saying why. The fetch's failures, one line each, are in test_hub_fetch.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chattts_client import TTSClient
from chattts_devtools import launcher
from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.config_model import ModelConfig
from chattts_server.model import hub as hub_module
from chattts_server.model.verify import OFFICIAL_FILES
from fake_hub import COMMIT, FakeHub, repo_files, sha256_map
from serverutil import DEV_MODEL_CACHE, REPO

REPO_ID = "test/tiny-chattts"
TOKENS = 24


def _speak(srv: launcher.ServerProcess) -> float:
    """Seconds of audio the server sends for a short text."""
    srv.wait_serving()
    config = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=5, min_new_tokens=TOKENS, max_new_tokens=TOKENS)
    )
    with TTSClient(srv.target) as client:
        stream = client.synthesize("The hub's weights speak.", config=config, timeout=60)
        for _ in stream:
            pass
    return float(stream.stats.audio_s)


def _launch(args: list[str], env: dict[str, str]) -> launcher.ServerProcess:
    return launcher.launch(
        ["--no-warmup", "--max-streams", "2", *args],
        dev_model="tiny",  # the dev model only where --dev-model-fallback falls back
        cache=DEV_MODEL_CACHE,
        echo=True,
        cwd=REPO,
        env=env,
    )


@pytest.fixture
def files(tiny_model_dir: Path) -> dict[str, bytes]:
    return repo_files(tiny_model_dir, {"README.md": b"# tiny\n"})


@pytest.fixture
def sha_map(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "sha256_map.json"
    path.write_text(json.dumps(sha256_map(files)))
    return path


def test_first_run_fetches_checks_and_serves_then_the_cache_serves_without_the_hub(
    tmp_path: Path, files: dict[str, bytes], sha_map: Path
) -> None:
    hf_home = tmp_path / "hf"
    args = ["--model", f"{REPO_ID}@{COMMIT}", "--sha256-map", str(sha_map)]
    with FakeHub(REPO_ID, files) as hub:
        env = {"HF_HOME": str(hf_home), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"}
        with _launch(args, env) as srv:
            assert _speak(srv) > 0
            assert srv.stop() == 0
        first = srv.log_text()
        assert sorted(hub.downloads()) == sorted(OFFICIAL_FILES)
    snapshot = hf_home / "hub" / "models--test--tiny-chattts" / "snapshots" / COMMIT
    assert f"loaded ChatTTS from {snapshot}" in first
    assert "RANDOM-WEIGHT" not in first

    # The hub gone (its port refuses connections): the complete snapshot needs none.
    with _launch(args, env) as srv:
        assert _speak(srv) > 0
        assert srv.stop() == 0
    second = srv.log_text()
    assert "in the Hugging Face cache" in second and "fetching" not in second
    assert f"loaded ChatTTS from {snapshot}" in second


def _make_run_command(**variables: str) -> list[str]:
    """What `make run` runs, as make prints it (-o install: nothing installed, nothing run)."""
    assignments = [f"{k}={v}" for k, v in variables.items()]
    printed = subprocess.run(
        ["make", "-s", "-n", "-o", "install", "run", *assignments],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    command = shlex.split(printed)
    assert command[0] == ".venv/bin/chattts-server", printed
    return command


def test_make_run_serves_the_official_weights_and_dev_model_tiny_keeps_the_dev_model() -> None:
    official = _make_run_command()
    assert official[official.index("--model") + 1] == "2Noise/ChatTTS"
    assert "--dev-model-fallback" in official and "--dev-model" not in official
    tiny = _make_run_command(DEV_MODEL="tiny")
    assert tiny[tiny.index("--dev-model") + 1] == "tiny" and "--model" not in tiny


def test_make_run_falls_back_to_the_dev_model_offline_saying_why_in_one_line(
    tmp_path: Path,
) -> None:
    command = _make_run_command(HOST="127.0.0.1", PORT="0", HTTP_PORT="0")
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with _launch(command[1:], env) as srv:
        assert _speak(srv) > 0
        assert srv.stop() == 0
    why = [line for line in srv.log if "dev model instead" in line]
    assert len(why) == 1, srv.log_text()
    assert "WARNING chattts_server.model.hub: --model 2Noise/ChatTTS: HF_HUB_OFFLINE=1" in why[0]


@pytest.fixture
def hub_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """huggingface_hub in this process as a server with HF_HOME=tmp_path and HF_HUB_OFFLINE=0
    has it (it reads them at import; its sessions take offline mode when first made)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    reset_sessions()
    yield
    monkeypatch.undo()
    reset_sessions()


@pytest.mark.parametrize("cause", ["unreachable", "no space"])
def test_the_fallback_covers_the_network_and_the_disk(
    cause: str,
    hub_settings: None,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, bytes],
    sha_map: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from huggingface_hub import constants

    config = ModelConfig(model=f"{REPO_ID}@{COMMIT}", dev_model_fallback=True, sha256_map=sha_map)
    with FakeHub(REPO_ID, files) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        if cause == "unreachable":
            hub.stop()
        else:
            hub.declared_sizes["asset/Embed.safetensors"] = 1 << 60
        resolved = hub_module.resolved(config)
    assert resolved.model is None and resolved.model_dir is None  # the dev model
    why = [r.getMessage() for r in caplog.records if "dev model instead" in r.getMessage()]
    assert len(why) == 1 and "\n" not in why[0]
    assert ("cannot be reached" if cause == "unreachable" else "no space left") in why[0]


def test_without_the_fallback_a_wrong_revision_is_an_error_even_in_make_run(
    hub_settings: None, monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes], sha_map: Path
) -> None:
    """Only the network and the disk fall back: a revision that does not exist, a wrong
    token or a file that fails its check is the user's to fix, even under `make run`."""
    from huggingface_hub import constants

    config = ModelConfig(model=f"{REPO_ID}@v0", dev_model_fallback=True, sha256_map=sha_map)
    with FakeHub(REPO_ID, files) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        with pytest.raises(hub_module.HubError, match="has no revision v0"):
            hub_module.resolved(config)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
