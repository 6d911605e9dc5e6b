"""Nothing in the suite reaches beyond this machine: a socket `connect` to an address outside the
loopback is refused and remembered, and the test that made it fails (tests/conftest.py). Unix
sockets, 127.0.0.0/8, ::1, `localhost` and the unspecified addresses (this machine) connect
as usual.

Only this process's Python sockets pass through here; servers the tests start as subprocesses
get HF_HUB_OFFLINE=1 from the suite's environment instead (tests/conftest.py).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

_lock = threading.Lock()
_refused: list[str] = []
_original: dict[str, Any] = {}


def _is_local(sock: socket.socket, address: Any) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return True  # unix sockets, netlink...
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, bytes):
        host = host.decode()
    if host in ("localhost", ""):
        return True
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False  # a name other than localhost would be looked up and reached
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified  # 0.0.0.0 and :: reach this machine


def _guarded(name: str) -> Any:
    original = _original[name]

    def connect(sock: socket.socket, address: Any) -> Any:
        if not _is_local(sock, address):
            with _lock:
                _refused.append(f"{name}({address!r})")
            raise ConnectionRefusedError(
                f"the test suite reaches no address but loopback: {address!r}"
            )
        return original(sock, address)

    return connect


def install() -> None:
    """Guard `socket.socket.connect` and `connect_ex` (once per process)."""
    if _original:
        return
    for name in ("connect", "connect_ex"):
        _original[name] = getattr(socket.socket, name)
        setattr(socket.socket, name, _guarded(name))


def take_refused() -> list[str]:
    """The connections refused since the last call."""
    with _lock:
        refused = list(_refused)
        _refused.clear()
    return refused
