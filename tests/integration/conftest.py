"""Fixtures the resume tests share (test_resume.py, test_resume_client.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config


@pytest.fixture(scope="module")
def resume_server(tiny_model_dir: Path) -> Iterator[InProcessServer]:
    """A server of the module's own: its streams' audio is compared with an uncut run's, so
    no other test's streams may share its batches."""
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=2)
    with InProcessServer(config) as srv:
        yield srv
