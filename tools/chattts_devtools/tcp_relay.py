"""A real TCP relay between a client and a server, on its own thread, whose connections can be
cut at any moment: what a car's connection does in a tunnel.

`cut()` resets every connection open through it (SO_LINGER 0: an RST each way, no FIN), so
both ends see the transport die, not a half-close. New connections are relayed as before, to
the port `retarget` names last: a proxy that sends the next call to another replica.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class TcpRelay:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self._target = (host, target_port)
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.connections = 0
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, name="tcp-relay", daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> int:
        """Reset every open connection (counted in `cuts` if there was one); how many."""
        count = self._reset_all()
        if count:
            self.cuts += 1
        return count

    def retarget(self, port: int) -> None:
        """New connections go to `port` from now on; open ones stay where they are."""
        self._target = (self._target[0], port)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self._reset_all()

    def _reset_all(self) -> int:
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            _reset(sock)
        return len(sockets) // 2

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open += [client, upstream]
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _reset(sink)
    _reset(source)


def _reset(sock: socket.socket) -> None:
    """Close with an RST (linger 0); SHUT_RD first wakes the relay thread reading it and sends
    nothing."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sock.close()
