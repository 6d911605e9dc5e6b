"""The suite's own guard (tests/conftest.py): offline for the hub, loopback only for sockets."""

from __future__ import annotations

import socket
import threading

import pytest

import network_guard


def test_the_suite_runs_with_the_hub_offline() -> None:
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE, "HF_HUB_OFFLINE=1 must be set before huggingface_hub loads"


@pytest.mark.parametrize(
    ("family", "address"),
    [
        (socket.AF_INET, ("192.0.2.1", 443)),  # TEST-NET-1: never routed, never reached
        (socket.AF_INET, ("huggingface.co", 443)),
        (socket.AF_INET6, ("2001:db8::1", 443)),
    ],
)
def test_a_connection_outside_the_loopback_is_refused_and_remembered(family, address) -> None:
    with (
        socket.socket(family, socket.SOCK_STREAM) as sock,
        pytest.raises(ConnectionRefusedError, match="loopback"),
    ):
        sock.connect(address)
    refused = network_guard.take_refused()  # taken, so this test itself does not fail
    assert refused == [f"connect({address!r})"]


def test_connect_ex_is_guarded_too() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock,
        pytest.raises(ConnectionRefusedError),
    ):
        sock.connect_ex(("192.0.2.1", 80))
    assert network_guard.take_refused() == ["connect_ex(('192.0.2.1', 80))"]


def test_loopback_and_unix_sockets_connect(tmp_path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            socket.create_connection((host, port), timeout=5).close()
    if socket.has_ipv6:
        try:
            server6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        except OSError:
            pass  # no IPv6 loopback on this machine
        else:
            with server6:
                socket.create_connection(("::1", server6.getsockname()[1]), timeout=5).close()
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        accepted = threading.Thread(target=lambda: listener.accept()[0].close())
        accepted.start()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
        accepted.join(5)
    assert network_guard.take_refused() == []
