"""`chattts-server --model REPO[@REVISION]` fetching from a local imitation of the hub
(tests/helpers/fake_hub.py) with the real huggingface_hub client, into a Hugging Face cache of
the test's own (HF_HOME). `--download-only` stops after the fetch, before torch loads: each run
is a second or two. The runs that serve are in test_hub_serve.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chattts_devtools.launcher import server_env
from chattts_server.model.hub import PINNED_REVISIONS
from chattts_server.model.verify import OFFICIAL_FILES
from fake_hub import COMMIT, FakeHub, repo_files, sha256_map

REPO_ID = "test/tiny-chattts"
RUN_TIMEOUT_S = 120
# Larger than huggingface_hub's 10 MiB download chunk, so half of it reaches the disk before a cut.
BIG_BYTES = 24 << 20


def snapshot(hf_home: Path) -> Path:
    return hf_home / "hub" / "models--test--tiny-chattts" / "snapshots" / COMMIT


def fetch(
    hf_home: Path, hub_url: str, sha_map: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`chattts-server --model ... --download-only`; the test's map; the hub turned back on."""
    spec = args[0] if args and not args[0].startswith("-") else f"{REPO_ID}@main"
    rest = args[1:] if args and not args[0].startswith("-") else args
    base = {"HF_HOME": str(hf_home), "HF_ENDPOINT": hub_url, "HF_HUB_OFFLINE": "0"}
    command = [sys.executable, "-m", "chattts_server.main", "--model", spec]
    command += ["--sha256-map", str(sha_map), "--download-only", *rest]
    return subprocess.run(
        command,
        env=server_env({**base, **env}),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def one_error_line(run: subprocess.CompletedProcess[str]) -> str:
    """A failed run's error: one line, its last, after the log's progress lines; no traceback."""
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("chattts-server: ")]
    assert errors == lines[-1:] and "Traceback" not in run.stderr, run.stderr
    return lines[-1]


@pytest.fixture
def files(tiny_model_dir: Path) -> dict[str, bytes]:
    """The tiny model in the official layout, and two files the server never loads."""
    return repo_files(tiny_model_dir, {"README.md": b"# tiny\n", "asset/GPT.pt": b"\0" * 4096})


@pytest.fixture
def hub(files: dict[str, bytes]) -> Iterator[FakeHub]:
    with FakeHub(REPO_ID, files) as hub:
        yield hub


@pytest.fixture
def sha_map(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "sha256_map.json"
    path.write_text(json.dumps(sha256_map(files)))
    return path


def test_fetches_only_the_files_the_server_loads_and_checks_them(
    tmp_path: Path, hub: FakeHub, sha_map: Path, files: dict[str, bytes]
) -> None:
    run = fetch(tmp_path, hub.url, sha_map)
    assert run.returncode == 0, run.stderr
    assert sorted(hub.downloads()) == sorted(OFFICIAL_FILES)
    for relpath in OFFICIAL_FILES:
        assert (snapshot(tmp_path) / relpath).read_bytes() == files[relpath]
        assert f"fetching {relpath}" in run.stderr  # a progress line per file in the log
    # @main was resolved to its commit and kept, so the cache answers it without the hub.
    refs = tmp_path / "hub" / "models--test--tiny-chattts" / "refs" / "main"
    assert refs.read_text() == COMMIT


def test_a_complete_snapshot_at_a_commit_is_read_with_no_network(
    tmp_path: Path, hub: FakeHub, sha_map: Path
) -> None:
    assert fetch(tmp_path, hub.url, sha_map, f"{REPO_ID}@{COMMIT}").returncode == 0
    seen = len(hub.requests)
    hub.stop()
    run = fetch(tmp_path, hub.url, sha_map, f"{REPO_ID}@{COMMIT}")
    assert run.returncode == 0, run.stderr
    assert len(hub.requests) == seen
    assert "in the Hugging Face cache" in run.stderr


def test_a_download_cut_halfway_resumes_where_it_stopped(
    tmp_path: Path, files: dict[str, bytes]
) -> None:
    big = hashlib.sha256(b"seed").digest() * (BIG_BYTES // 32)
    files = {**files, "asset/gpt/model.safetensors": big}
    sha_map = tmp_path / "map.json"
    sha_map.write_text(json.dumps(sha256_map(files)))
    with FakeHub(REPO_ID, files) as hub:
        hub.cut_once.add("asset/gpt/model.safetensors")
        line = one_error_line(fetch(tmp_path / "hf", hub.url, sha_map))
        assert "asset/gpt/model.safetensors" in line and "resumes" in line
        partial = list((tmp_path / "hf").rglob("*.incomplete"))
        assert len(partial) == 1 and 0 < partial[0].stat().st_size < len(big)
        kept = partial[0].stat().st_size

        run = fetch(tmp_path / "hf", hub.url, sha_map)
        assert run.returncode == 0, run.stderr
        ranges = [s.range for s in hub.gets() if s.path.endswith("/asset/gpt/model.safetensors")]
        assert ranges == [None, f"bytes={kept}-"]
    assert (snapshot(tmp_path / "hf") / "asset/gpt/model.safetensors").read_bytes() == big
    assert not list((tmp_path / "hf").rglob("*.incomplete"))


def test_a_tampered_file_is_refused_by_name_and_not_kept(
    tmp_path: Path, hub: FakeHub, sha_map: Path, files: dict[str, bytes]
) -> None:
    tampered = bytearray(files["asset/Vocos.safetensors"])
    tampered[-1] ^= 0xFF
    hub.served["asset/Vocos.safetensors"] = bytes(tampered)
    line = one_error_line(fetch(tmp_path, hub.url, sha_map))
    assert "asset/Vocos.safetensors: sha256 mismatch" in line and "removed" in line
    assert not (snapshot(tmp_path) / "asset/Vocos.safetensors").exists()
    blobs = tmp_path / "hub" / "models--test--tiny-chattts" / "blobs"
    assert bytes(tampered) not in [p.read_bytes() for p in blobs.iterdir()]

    # The hub fixed, a next run fetches that file alone again.
    del hub.served["asset/Vocos.safetensors"]
    before = len(hub.downloads())
    assert fetch(tmp_path, hub.url, sha_map).returncode == 0
    assert hub.downloads()[before:] == ["asset/Vocos.safetensors"]


def test_a_file_tampered_in_the_cache_is_refused_and_removed(
    tmp_path: Path, hub: FakeHub, sha_map: Path
) -> None:
    spec = f"{REPO_ID}@{COMMIT}"
    assert fetch(tmp_path, hub.url, sha_map, spec).returncode == 0
    config = snapshot(tmp_path) / "asset/gpt/config.json"
    blob = config.resolve()
    blob.write_bytes(blob.read_bytes() + b" ")
    line = one_error_line(fetch(tmp_path, hub.url, sha_map, spec))
    assert "asset/gpt/config.json: sha256 mismatch" in line
    assert not config.exists() and not blob.exists()


def test_a_revision_that_does_not_exist(tmp_path: Path, hub: FakeHub, sha_map: Path) -> None:
    line = one_error_line(fetch(tmp_path, hub.url, sha_map, f"{REPO_ID}@v9"))
    assert line == f"chattts-server: {REPO_ID} has no revision v9 on {hub.url}"
    assert not hub.gets()


def test_a_wrong_token(tmp_path: Path, files: dict[str, bytes], sha_map: Path) -> None:
    with FakeHub(REPO_ID, files, token="hf_right") as hub:
        line = one_error_line(fetch(tmp_path, hub.url, sha_map, HF_TOKEN="hf_wrong"))
        assert "refused the token (401)" in line and "HF_TOKEN" in line
        assert fetch(tmp_path, hub.url, sha_map, HF_TOKEN="hf_right").returncode == 0
        assert {s.authorization for s in hub.requests} == {"Bearer hf_wrong", "Bearer hf_right"}


def test_offline_with_an_empty_cache(tmp_path: Path, hub: FakeHub, sha_map: Path) -> None:
    line = one_error_line(fetch(tmp_path, hub.url, sha_map, HF_HUB_OFFLINE="1"))
    assert "HF_HUB_OFFLINE=1" in line and str(tmp_path / "hub") in line
    assert hub.requests == []


def test_the_hub_unreachable(tmp_path: Path, hub: FakeHub, sha_map: Path) -> None:
    hub.stop()
    line = one_error_line(fetch(tmp_path, hub.url, sha_map))
    assert f"the hub at {hub.url} cannot be reached" in line


def test_no_space_left_is_said_before_downloading(
    tmp_path: Path, hub: FakeHub, sha_map: Path
) -> None:
    hub.declared_sizes["asset/gpt/model.safetensors"] = 1 << 60  # an exabyte
    line = one_error_line(fetch(tmp_path, hub.url, sha_map))
    assert "no space left" in line and "HF_HOME" in line
    assert not hub.gets()


def test_the_official_repo_is_pinned_and_a_repo_without_a_pin_needs_a_revision(
    tmp_path: Path, hub: FakeHub, sha_map: Path
) -> None:
    assert PINNED_REVISIONS["2Noise/ChatTTS"] == "1a3c04a8b0651689bd9242fbb55b1f4b5a9aef84"
    line = one_error_line(fetch(tmp_path, hub.url, sha_map, REPO_ID))
    assert f"--model {REPO_ID}@REVISION" in line
    assert hub.requests == []


def test_the_default_map_is_chattts_published_one(tmp_path: Path, hub: FakeHub) -> None:
    """Without --sha256-map the tiny model's random weights are no official weights."""
    run = subprocess.run(
        [sys.executable, "-m", "chattts_server.main", "--model", f"{REPO_ID}@main"]
        + ["--download-only"],
        env=server_env({"HF_HOME": str(tmp_path), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"}),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    line = one_error_line(run)
    assert "sha256 mismatch" in line
    assert os.environ["HF_HUB_OFFLINE"] == "1", "the suite's own setting is untouched"


def test_a_cache_that_cannot_be_written(tmp_path: Path, hub: FakeHub, sha_map: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    line = one_error_line(fetch(not_a_folder, hub.url, sha_map))
    assert "the Hugging Face cache" in line and "cannot be written" in line


def test_an_unreadable_sha256_map(tmp_path: Path, hub: FakeHub) -> None:
    line = one_error_line(fetch(tmp_path, hub.url, tmp_path / "missing.json"))
    assert line.startswith("chattts-server: --sha256-map ") and "missing.json" in line
    assert hub.requests == []
