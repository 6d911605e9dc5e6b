"""Shared fixtures: the tiny random-weight ChatTTS model and a real server on a loopback port."""

from __future__ import annotations

from pathlib import Path

import pytest

from serverutil import InProcessServer, tiny_server_config

REPO = Path(__file__).resolve().parents[1]
DEV_MODEL_CACHE = REPO / ".cache" / "dev-models"


@pytest.fixture(scope="session")
def dev_model_cache() -> Path:
    return DEV_MODEL_CACHE


@pytest.fixture(scope="session")
def tiny_model_dir(dev_model_cache: Path) -> Path:
    """The tiny random-weight model in the official layout, built once and reused."""
    from chattts_server.model.dev_assets import build_dev_assets

    return build_dev_assets("tiny", dev_model_cache)


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> InProcessServer:
    """One real server for the integration tests that do not stop or break it."""
    with InProcessServer(tiny_server_config(DEV_MODEL_CACHE, max_streams=4, max_queue=4)) as srv:
        yield srv
