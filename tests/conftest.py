"""Shared fixtures: the tiny random-weight ChatTTS model, a real server on a loopback port and
a throw-away PKI. Helpers the tests import live in tests/helpers/ (on the tests' path).

Nothing here reaches the real model hub, or any address beyond the loopback: the suite runs with
HF_HUB_OFFLINE=1 (set before anything imports huggingface_hub, which reads it at import, and
inherited by the servers tests start; the tests of `--model` point HF_ENDPOINT at a local
imitation and turn it off for that server alone), and a test whose process connects outside the
loopback fails (tests/helpers/network_guard.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import network_guard  # noqa: E402
from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config  # noqa: E402

network_guard.install()


@pytest.fixture(autouse=True)
def _loopback_only() -> Iterator[None]:
    """Fail the test if it (or a thread during it) connected outside the loopback."""
    network_guard.take_refused()
    yield
    refused = network_guard.take_refused()
    if refused:
        pytest.fail(f"connected outside the loopback: {', '.join(refused)}", pytrace=False)


def pytest_report_header() -> list[str]:
    """The machine under the run, first: a failure on one kind of CPU shows as such."""
    import os
    import re

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flag_line = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    flags = set(flag_line.group(1).split()) if flag_line else set()
    kinds = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8") if f in flags]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    name = model.group(1) if model else "unknown CPU"
    return [f"cpu: {name} ({' '.join(kinds)}); {os.cpu_count()} cores; load average {load}"]


@pytest.fixture(scope="session")
def dev_model_cache() -> Path:
    return DEV_MODEL_CACHE


@pytest.fixture(scope="session")
def tiny_model_dir(dev_model_cache: Path) -> Path:
    """The tiny random-weight model in the official layout, built once and reused."""
    from chattts_server.devmodel.assets import build_dev_assets

    return build_dev_assets("tiny", dev_model_cache)


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> InProcessServer:
    """One real server for the integration tests that do not stop or break it."""
    with InProcessServer(tiny_server_config(DEV_MODEL_CACHE, max_streams=4, max_queue=4)) as srv:
        yield srv


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    from pki import make_pki  # cryptography: not on the GPU machine, which runs tests too

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fake():  # type: ignore[no-untyped-def]
    """A fake TextToSpeech servicer (tests/helpers/fake_tts.py) on a loopback port of its own, for
    the client library tests: (servicer, target)."""
    from fake_tts import FakeServicer, start_fake_server

    servicer = FakeServicer()
    server, port = start_fake_server(servicer)
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)
