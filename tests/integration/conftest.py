"""Fixtures modules share: the resume tests' server (test_resume.py, test_resume_client.py), and
the WebSocket contexts' (test_ws_contexts.py, test_ws_context_client.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from httputil import http_server, wait_idle, ws_stream_url
from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config


@pytest.fixture(scope="module")
def resume_server(tiny_model_dir: Path) -> Iterator[InProcessServer]:
    """A server of the module's own: its streams' audio is compared with an uncut run's, so
    no other test's streams may share its batches."""
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=2)
    with InProcessServer(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def contexts_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessServer]:
    """A server with its HTTP door, 3 contexts a socket, none closed for idling."""
    limits = {"ws_max_contexts": 3, "ws_context_idle_s": 600.0}
    folder = tmp_path_factory.mktemp("ws-contexts")
    with http_server(folder, max_streams=4, max_queue=4, limits=limits) as server:
        yield server


@pytest.fixture
def contexts_url(contexts_server: InProcessServer) -> Iterator[str]:
    """Its WebSocket route; the server is idle again after the test."""
    yield ws_stream_url(contexts_server)
    wait_idle(contexts_server, "the server to be idle after the test")
