"""Replicas on fixed loopback ports and HAProxy in front of them with a shipped config, for the
replica tests (tests/e2e/test_haproxy_replicas.py) and bench/bench_replicas.py.

    with Replicas(3, cache) as replicas, HAProxy(CONFIGS["haproxy"], replicas) as proxy:
        ...load on proxy.grpc_target / proxy.http_url, or on replicas.direct_target...
        replicas.restart(replicas.members[0])   # SIGTERM, drain, relaunch on the same ports
        replicas.kill(replicas.members[1])      # SIGKILL

Each replica keeps its ports across restarts, so the proxy's server lines (filled from the
environment, as the shipped files expect) stay true.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from .launcher import ServerProcess, free_port, launch, wait_serving

_REPO = Path(__file__).resolve().parents[2]
HAPROXY_DIR = _REPO / "deploy" / "haproxy"
CONFIGS = {
    "haproxy": HAPROXY_DIR / "haproxy.cfg",
    "plain": HAPROXY_DIR / "haproxy-plain.cfg",
    "operator": Path(__file__).with_name("haproxy-operator.cfg"),
}
"""The shipped files (readiness-checked, and the plain TCP-checked variant), and the bare config
most operators first write (TCP checks, retries and redispatch, nothing else)."""
MAX_REPLICAS = 3
"""Server lines in the shipped files; unused ones point at a port nobody listens on."""
# --max-streams 12: sized N+1, as an operator would, so two replicas take the whole load once a
# third is gone (the replica tests run three loads of 8 callers at once: 24 calls). With 8 places
# the survivors of a kill queued a third of the calls, and their first audio doubled from the
# queue alone, not from anything the kill did. Queued streams in a drain are tested on their
# own (tests/integration/test_reliability.py). --grace-s 30: on a 2-core machine loaded by other
# jobs a call took up to 15 s; the drain waits only as long as its streams need.
REPLICA_ARGS = ("--max-streams", "12", "--max-queue", "16", "--grace-s", "30", "--no-warmup")


def haproxy_missing() -> str | None:
    """Why HAProxy cannot run here (`make proxy` installs it), or None."""
    return None if shutil.which("haproxy") else "haproxy is not installed (make proxy)"


@dataclass
class Replica:
    name: str  # the server name in the HAProxy files: r1, r2, r3
    grpc_port: int
    http_port: int
    process: ServerProcess | None = None
    drained_logs: list[str] = field(default_factory=list)
    """The output of each process of it that `Replicas.restart` drained, oldest first."""

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _http_ready(url: str) -> bool:
    try:
        return httpx2.get(url + "/health", timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


class Replicas:
    """`num` tiny-model servers, each with gRPC and the HTTP door on ports of its own."""

    def __init__(
        self, num: int, cache: Path | str | None, args: Sequence[str] = REPLICA_ARGS
    ) -> None:
        if not 1 <= num <= MAX_REPLICAS:
            raise ValueError(f"1 to {MAX_REPLICAS} replicas (the shipped files' server lines)")
        self.cache = cache
        self.args = list(args)
        self.members = [Replica(f"r{i + 1}", free_port(), free_port()) for i in range(num)]
        self._unused = [free_port() for _ in range(2 * (MAX_REPLICAS - num))]

    def start(self, timeout_s: float = 180.0) -> None:
        for replica in self.members:
            self._launch(replica)
        for replica in self.members:
            self.wait_ready(replica, timeout_s)

    def _launch(self, replica: Replica) -> None:
        ports = ["--port", str(replica.grpc_port), "--http-port", str(replica.http_port)]
        replica.process = launch([*self.args, *ports], cache=self.cache)

    def wait_ready(self, replica: Replica, timeout_s: float = 180.0) -> None:
        """SERVING on grpc.health.v1 and 200 on the HTTP door's /health."""
        deadline = time.monotonic() + timeout_s
        wait_serving(replica.target, timeout_s)
        while not _http_ready(replica.http_url):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{replica.name}: /health never answered 200")
            time.sleep(0.1)

    def restart(self, replica: Replica, timeout_s: float = 180.0) -> int:
        """SIGTERM (the replica drains its streams), relaunch on the same ports, wait until it
        serves again; returns the drained process's exit code."""
        assert replica.process is not None
        code = replica.process.stop(timeout_s=45)
        replica.drained_logs.append(replica.process.log_text())
        self._launch(replica)
        self.wait_ready(replica, timeout_s)
        return code

    def kill(self, replica: Replica) -> None:
        assert replica.process is not None
        replica.process.proc.send_signal(signal.SIGKILL)
        replica.process.proc.wait(10)

    def revive(self, replica: Replica, timeout_s: float = 180.0) -> None:
        self._launch(replica)
        self.wait_ready(replica, timeout_s)

    @property
    def direct_target(self) -> str:
        """Every replica in one gRPC target, for a client's own round robin."""
        return "ipv4:" + ",".join(r.target for r in self.members)

    def env(self) -> dict[str, str]:
        """The shipped HAProxy files' server addresses."""
        env: dict[str, str] = {}
        ports = [(r.grpc_port, r.http_port) for r in self.members]
        unused = iter(self._unused)
        ports += [(next(unused), next(unused)) for _ in range(MAX_REPLICAS - len(self.members))]
        for i, (grpc_port, http_port) in enumerate(ports, start=1):
            env[f"CHATTTS_REPLICA{i}_HOST"] = "127.0.0.1"
            env[f"CHATTTS_REPLICA{i}_GRPC_PORT"] = str(grpc_port)
            env[f"CHATTTS_REPLICA{i}_HTTP_PORT"] = str(http_port)
        return env

    def close(self) -> None:
        for replica in self.members:
            if replica.process is not None:
                replica.process.stop(timeout_s=15)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HAProxy:
    """`haproxy -db -f <config>` on two free ports, its server lines filled from `replicas`."""

    def __init__(self, config: Path, replicas: Replicas) -> None:
        self.config = config
        self.replicas = replicas
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.log: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout_s: float = 10.0, attempts: int = 3) -> None:
        """Start, on two other free ports when another process took one of these between
        `free_port` and HAProxy's bind (HAProxy exits: cannot bind)."""
        for _ in range(attempts - 1):
            if self._start_once(timeout_s):
                return
            self.grpc_port, self.http_port = free_port(), free_port()
        if not self._start_once(timeout_s):
            raise RuntimeError("haproxy could not bind its ports:\n" + "".join(self.log))

    def _start_once(self, timeout_s: float) -> bool:
        """Serving on both ports: True; exited as a port was taken: False."""
        env = {
            **os.environ,
            **self.replicas.env(),
            "CHATTTS_PROXY_GRPC_BIND": f"127.0.0.1:{self.grpc_port}",
            "CHATTTS_PROXY_HTTP_BIND": f"127.0.0.1:{self.http_port}",
        }
        self.log = []
        self.proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        threading.Thread(target=self._read, daemon=True, name="haproxy-log").start()
        deadline = time.monotonic() + timeout_s
        # Both ports answer and HAProxy still runs: another server on a port it failed to bind
        # would answer too, but HAProxy would have exited.
        while not (
            _http_ready(self.http_url) and _accepts(self.grpc_port) and self.proc.poll() is None
        ):
            if self.proc.poll() is not None:
                self.proc.wait()
                if any("cannot bind" in line for line in self.log):
                    return False
                raise RuntimeError("haproxy did not start:\n" + "".join(self.log))
            if time.monotonic() > deadline:
                raise RuntimeError("haproxy did not start:\n" + "".join(self.log))
            time.sleep(0.1)
        return True

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> HAProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
