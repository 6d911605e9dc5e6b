"""Run `chattts-server` as a subprocess on a free loopback port, for tests and benchmarks.

    with launch(["--max-streams", "4"], dev_model="tiny", cache=cache) as srv:
        srv.wait_serving()
        ...talk to srv.target...
        rc = srv.stop()  # SIGTERM: drain, then exit

`launch` returns once the server prints "listening on port N"; its output (log lines included)
is kept in `srv.log` and, if asked, echoed to stderr and written to a file. Leaving the `with`
block kills a server that is still running, whatever happened inside it.

A benchmark with `--target`, `--model-dir`, `--dev-model` and `--device` flags gets its server
from `bench_server(args)`: the given target, or one launched for the `with` block.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_LISTENING = re.compile(r"listening on port (\d+)(?: \(http \d+\))?$")
_HTTP = re.compile(r"listening on port \d+ \(http (\d+)\)")
# The folders of a checkout that hold chattts_server and chattts_client.
_REPO = Path(__file__).resolve().parents[2]
_SERVER_ROOT = _REPO / "server"
_CLIENT_ROOT = _REPO / "client"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_serving(
    target: str,
    timeout_s: float = 120.0,
    credentials: grpc.ChannelCredentials | None = None,
    failure: Callable[[], BaseException | None] = lambda: None,
) -> None:
    """Poll grpc.health.v1 until `target` reports SERVING; TimeoutError after `timeout_s`.
    `failure` returns why the server will never serve (RuntimeError from it at once)."""
    deadline = time.monotonic() + timeout_s
    channel = (
        grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if (cause := failure()) is not None:
                raise RuntimeError(f"{target} will not serve: {cause}") from cause
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{target} did not report SERVING within {timeout_s} s")


@dataclass
class ServerProcess:
    """A running `chattts-server` subprocess; its output lines are kept in `log`."""

    proc: subprocess.Popen[str]
    port: int
    metrics_port: int  # 0 when metrics are off
    log: list[str] = field(default_factory=list)
    voices: Path | None = None  # a test's voice folder, if it gave one
    http_port: int = 0  # 0 when the HTTP front door is off

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return "".join(self.log)

    def count(self, needle: str) -> int:
        """How many output lines so far contain `needle`."""
        return sum(needle in line for line in list(self.log))

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        wait_serving(self.target, timeout_s, failure=self._exited)

    def _exited(self) -> BaseException | None:
        code = self.proc.poll()
        if code is None:
            return None
        return ChildProcessError(f"exited {code}; its last lines:\n{''.join(self.log[-20:])}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the server drains), then SIGKILL after `timeout_s`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        """Whatever happened in the block, leave no server behind."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with chattts_server (and a checkout's chattts_client) importable."""
    paths = [str(_SERVER_ROOT)]
    if _CLIENT_ROOT.is_dir():
        paths.insert(0, str(_CLIENT_ROOT))
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(extra or {})}


def _with(base: dict[str, str], extra: dict[str, str] | None) -> dict[str, str]:
    if not extra:
        return base
    merged = {**base, **extra}
    if "PYTHONPATH" in extra:
        merged["PYTHONPATH"] = os.pathsep.join([extra["PYTHONPATH"], base["PYTHONPATH"]])
    return merged


def _command(
    args: Sequence[str],
    dev_model: str | None,
    cache: Path | str | None,
    device: str,
    metrics_port: int,
    http: bool,
) -> list[str]:
    cmd = [sys.executable, "-m", "chattts_server.main", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--device", device]
    if dev_model is not None:
        cmd += ["--dev-model", dev_model]
    if cache is not None:
        cmd += ["--dev-model-cache", str(cache)]
    cmd += ["--metrics-port", str(metrics_port), *args]
    if http:
        cmd += ["--http-port", str(free_port())]
    return cmd


def launch(
    args: Sequence[str] = (),
    *,
    dev_model: str | None = "tiny",
    cache: Path | str | None = None,
    device: str = "cpu",
    metrics: bool = False,
    http: bool = False,
    start_timeout_s: float = 120.0,
    echo: bool = False,
    log_path: Path | str | None = None,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start `python -m chattts_server.main` on a free loopback port; return once it listens.

    `dev_model` (with `cache`, the dev-model cache folder) serves a random-weight dev model; pass
    None and a `--model-dir` in `args` for real weights. `metrics` opens the Prometheus endpoint
    on another free port, `http` the HTTP front door on a third. `echo` copies the output to
    stderr, `log_path` to a file. `env` adds to the server's environment (PYTHONPATH entries go
    first). Raises
    RuntimeError, with the output so far, when the server exits or stays silent too long.
    """
    metrics_port = free_port() if metrics else 0
    cmd = _command(args, dev_model, cache, device, metrics_port, http)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=_with(server_env(), env),
    )
    sink = open(log_path, "w", encoding="utf-8") if log_path else None  # noqa: SIM115 - _tee closes it
    lines: list[str] = []
    # Read on a thread so a server that hangs before printing cannot block us past the deadline.
    listening = threading.Event()
    threading.Thread(
        target=_tee, args=(proc, lines, listening, echo, sink), name="server-log", daemon=True
    ).start()
    listening.wait(start_timeout_s)
    port = _port(lines)
    if port is None:  # timed out, or the output ended (the server exited) without the line
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"server did not start (exit {proc.returncode}):\n" + "".join(lines))
    http_port = next((int(m.group(1)) for m in map(_HTTP.search, list(lines)) if m), 0)
    return ServerProcess(proc, port, metrics_port, lines, http_port=http_port)


def add_bench_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `bench_server` reads: which server (--target) or what it serves (--dev-model or
    --model-dir, on --device), with --server-arg and --server-log for one it starts."""
    parser.add_argument("--target", help="an already running server; else one is started")
    parser.add_argument("--dev-model", default="tiny", help="random-weight model: tiny or full")
    parser.add_argument("--model-dir", help="real weights instead of a dev model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra server flag (repeatable)"
    )
    parser.add_argument("--server-log", help="write the server's output to this file")


@contextmanager
def bench_server(args: argparse.Namespace, extra_args: Sequence[str] = ()) -> Iterator[str]:
    """The target a benchmark measures: `args.target` when given, else that of a server
    launched for the block and stopped after it, so it drains.

    The server serves `args.model_dir`, or the dev model `args.dev_model` from the checkout's
    dev-model cache, on `args.device`, with `extra_args` then `args.server_arg` (each
    "--flag=value" or "--flag"), its output written to `args.server_log`: the flags of
    `add_bench_server_arguments`. A script without one of these flags gets the default.
    """
    if getattr(args, "target", None):
        yield args.target
        return
    model_dir = getattr(args, "model_dir", None)
    server_args = [
        *(["--model-dir", model_dir] if model_dir else []),
        *extra_args,
        *(part for arg in getattr(args, "server_arg", []) for part in arg.split("=", 1)),
    ]
    with launch(
        server_args,
        dev_model=None if model_dir else getattr(args, "dev_model", "tiny"),
        cache=_REPO / ".cache" / "dev-models",
        device=getattr(args, "device", "cpu"),
        log_path=getattr(args, "server_log", None),
        cwd=_REPO,
    ) as server:
        server.wait_serving()
        yield server.target
        server.stop()


def _port(lines: list[str]) -> int | None:
    for line in list(lines):
        m = _LISTENING.search(line)
        if m:
            return int(m.group(1))
    return None


def _tee(
    proc: subprocess.Popen[str],
    lines: list[str],
    listening: threading.Event,
    echo: bool,
    sink: TextIO | None,
) -> None:
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            if echo:
                sys.stderr.write("[server] " + line)
            if sink is not None:
                sink.write(line)
                sink.flush()
            if not listening.is_set() and _LISTENING.search(line):
                listening.set()
    finally:
        listening.set()  # the output ended: wake launch() to report the exit
        if sink is not None:
            sink.close()
