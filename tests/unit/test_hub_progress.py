"""`--model`'s progress lines where stderr is no terminal (a container's log): the bytes in the
cache so far, `.incomplete` files included, every few seconds while files download."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

from chattts_server.model import hub
from polling import wait_until


def test_progress_lines_count_the_bytes_the_cache_gained(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "_PROGRESS_EVERY_S", 0.02)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # no terminal, even under pytest -s
    model = hub.HubModel("test/tiny", "main")
    blobs = model.storage / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "before").write_bytes(b"\0" * 5_000_000)  # in the cache already: not counted
    caplog.set_level(logging.INFO, logger=hub.__name__)
    with hub._progress(model, total_bytes=4_000_000):
        (blobs / "etag.incomplete").write_bytes(b"\0" * 2_000_000)
        wait_until(
            lambda: any("2 of 4 MB" in r.getMessage() for r in caplog.records),
            timeout_s=30,
            what="a progress line with the partial file's 2 MB",
        )
    assert "fetched 4 MB" in caplog.records[-1].getMessage()
