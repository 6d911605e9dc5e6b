"""Deployment files under deploy/docker: the Dockerfiles, docker-compose, and the image's
HEALTHCHECK script against a real grpc.health.v1 server. Offline and fast."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent import futures
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from deploy_files import (
    DOCKER,
    EXIT_MARGIN_S,
    GRPC_PORT,
    HTTP_PORT,
    K8S,
    METRICS_PORT,
    REPO,
    config_from_args,
    pod_spec,
    render,
)


def _dockerfile(name: str) -> str:
    return (DOCKER / name).read_text().replace("\\\n", "")


def _instructions(text: str, keyword: str) -> list[str]:
    return [
        line.split(None, 1)[1] for line in text.splitlines() if line.split(None, 1)[:1] == [keyword]
    ]


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_dockerfile_runs_the_server_non_root_with_ports_and_healthcheck(name):
    text = _dockerfile(name)
    assert json.loads(_instructions(text, "ENTRYPOINT")[-1]) == ["chattts-server"]
    exposed = set(_instructions(text, "EXPOSE")[-1].split())
    assert exposed == {str(GRPC_PORT), str(HTTP_PORT), str(METRICS_PORT)}
    user = _instructions(text, "USER")[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0
    pod = pod_spec(render(K8S / "base"))["securityContext"]
    assert int(user) == pod["runAsUser"], "image user and Kubernetes runAsUser differ"
    assert "chattts-healthcheck" in _instructions(text, "HEALTHCHECK")[-1]
    cfg = config_from_args(json.loads(_instructions(text, "CMD")[-1]))
    assert cfg.network.metrics_port == METRICS_PORT
    assert cfg.network.http_port == HTTP_PORT
    for source in _instructions(text, "COPY"):
        src = source.split()[0]
        assert src == "." or (REPO / src).exists(), src
    # torch/torchaudio pinned like the `server` extra (the native library must match torch).
    pins = _requirements_from_dockerfile(text)
    (arg,) = [a for a in _instructions(text, "ARG") if a.startswith("TORCH_VERSION=")]
    torch_version = arg.split("=", 1)[1]
    assert f"torch=={torch_version}" in pins and f"torchaudio=={torch_version}" in pins
    assert "chattts-stream" not in " ".join(pins)
    if name == "Dockerfile.cpu":  # the GPT's CPU path, built for any AVX2 CPU, not the builder's
        assert any(p.startswith("llama-cpp-python==") for p in pins), pins
        assert "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON" in text


def _requirements_from_dockerfile(text: str) -> list[str]:
    """Run the Dockerfile's own pyproject -> requirements one-liner on the real pyproject."""
    (code,) = re.findall(r'python -c "(import tomllib.*?)" > /tmp/requirements.txt', text)
    code = code.replace("/src/pyproject.toml", str(REPO / "pyproject.toml"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    reqs = out.stdout.split()
    assert "grpcio-health-checking" in " ".join(reqs) and "prometheus-client" in " ".join(reqs)
    return reqs


def test_dockerfile_bases_and_device_defaults():
    cpu, gpu = _dockerfile("Dockerfile.cpu"), _dockerfile("Dockerfile.gpu")
    assert _instructions(cpu, "FROM") == ["python:3.11-slim"]
    assert "download.pytorch.org/whl/cpu" in cpu
    assert re.search(r"nvidia/cuda:12\.8\.\d+-", gpu)
    assert "download.pytorch.org/whl/cu128" in gpu
    gpu_cfg = config_from_args(json.loads(_instructions(gpu, "CMD")[-1]))
    assert (gpu_cfg.model.device, gpu_cfg.model.dtype) == ("cuda", "float16")
    cpu_cfg = config_from_args(json.loads(_instructions(cpu, "CMD")[-1]))
    assert cpu_cfg.model.device == "cpu" and cpu_cfg.model.model_dir is None


def test_dockerignore_keeps_the_build_context_small():
    # `COPY . /src` in the Dockerfiles sends the whole repo without it (the venv alone is GBs).
    path = REPO / ".dockerignore"
    assert path.exists(), "add .dockerignore at the repo root (see deploy/k8s/README.md)"
    lines = {line.strip().rstrip("/") for line in path.read_text().splitlines()}
    assert {".venv", ".git"} <= lines


def test_compose_services_build_existing_dockerfiles_with_valid_commands():
    compose_file = DOCKER / "docker-compose.yml"
    compose = yaml.safe_load(compose_file.read_text())
    services = compose["services"]
    assert set(services) == {"chattts-cpu", "chattts-gpu"}
    for name, svc in services.items():
        context = (compose_file.parent / svc["build"]["context"]).resolve()
        assert context == REPO, name
        assert (context / svc["build"]["dockerfile"]).is_file(), name
        cfg = config_from_args(svc["command"])
        grace_period_s = int(svc["stop_grace_period"].rstrip("s"))
        assert grace_period_s >= cfg.admission.grace_s + EXIT_MARGIN_S, name
        container_ports = {int(p.split(":")[1]) for p in svc["ports"]}
        assert container_ports == {GRPC_PORT, HTTP_PORT, METRICS_PORT}, name
        assert cfg.network.metrics_port == METRICS_PORT and cfg.network.http_port == HTTP_PORT
        assert any(v.startswith("./models:/models") for v in svc["volumes"]), name
    assert "profiles" not in services["chattts-cpu"]
    gpu = services["chattts-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert config_from_args(gpu["command"]).model.device == "cuda"
    host_ports = [p.split(":")[0] for s in services.values() for p in s["ports"]]
    assert len(host_ports) == len(set(host_ports)), "both services must be able to run at once"


# ---------------------------------------------------------------------------------------------
# The image's HEALTHCHECK script, against a real grpc.health.v1 server.

HEALTHCHECK = DOCKER / "healthcheck.py"


@pytest.fixture
def health_server():
    sys.path.insert(0, str(DOCKER))
    try:
        import healthcheck  # deploy/docker/healthcheck.py
    finally:
        sys.path.remove(str(DOCKER))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield healthcheck, servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_healthcheck_exit_status_follows_serving_status(health_server, capsys):
    healthcheck, servicer, addr = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck.main(["--addr", addr]) == 1
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck.main(["--addr", addr]) == 0
    assert healthcheck.main(["--addr", addr, "--service", "no.such.Service"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().out
    servicer.enter_graceful_shutdown()  # what the server does on SIGTERM: all NOT_SERVING
    assert healthcheck.main(["--addr", addr]) == 1


def test_healthcheck_script_runs_standalone(health_server):
    _, servicer, addr = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    run = subprocess.run(
        [sys.executable, str(HEALTHCHECK), "--addr", addr, "--timeout-s", "5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    closed = subprocess.run(  # nothing listens: fails within the timeout, not hangs
        [sys.executable, str(HEALTHCHECK), "--addr", "127.0.0.1:1", "--timeout-s", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (run.returncode, run.stdout.strip()) == (0, "SERVING"), run.stderr
    assert closed.returncode == 1 and "UNAVAILABLE" in closed.stdout, closed.stdout + closed.stderr


def test_readme_round_robin_channel_example_runs(health_server):
    # The client-side load-balancing snippet in deploy/k8s/README.md, pointed at a local server:
    # gRPC rejects a channel whose service config it cannot parse, so this catches a broken one.
    _, servicer, addr = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    readme = (K8S / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    target = "chattts-stream-headless.chattts.svc.cluster.local:50051"
    assert f"dns:///{target}" in code
    namespace: dict[str, Any] = {}
    exec(code.replace(target, addr), namespace)
    with namespace["channel"] as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
