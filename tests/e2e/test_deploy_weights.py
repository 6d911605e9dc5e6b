"""Where the deployments' official weights come from (issue 51): an image built with them inside
(`--build-arg MODEL`), or a Hugging Face cache on a volume (the gpu overlay's claim, filled once
by job-fill-models.yaml; a Docker volume). Every path and flag is checked against the server's own
parser and the images' HF_HUB_CACHE. Offline and fast."""

from __future__ import annotations

import json
import re
import shlex

import kubernetes_validate
import pytest
import yaml

from chattts_server.model.hub import PINNED_REVISIONS
from deploy_files import (
    DOCKER,
    OVERLAYS,
    config_from_args,
    load_yaml_docs,
    one,
    pod_spec,
    render,
    server_config,
    server_container,
)

K8S_VERSION = "1.30"
DOCKERFILES = ["Dockerfile.cpu", "Dockerfile.gpu"]


def _dockerfile(name: str) -> str:
    return (DOCKER / name).read_text().replace("\\\n", "")


def _instructions(text: str, keyword: str) -> list[str]:
    return [
        line.split(None, 1)[1] for line in text.splitlines() if line.split(None, 1)[:1] == [keyword]
    ]


def _hub_cache(name: str) -> str:
    """The image's HF_HUB_CACHE."""
    (path,) = re.findall(r"\bHF_HUB_CACHE=(\S+)", _dockerfile(name))
    return path


@pytest.mark.parametrize("name", DOCKERFILES)
def test_an_image_can_hold_the_weights_fetched_and_checked_at_build_time(name: str) -> None:
    text = _dockerfile(name)
    assert re.search(r"^ARG MODEL=$", text, re.M), "no weights unless asked for"
    (fetch,) = [line for line in _instructions(text, "RUN") if "--download-only" in line]
    command = shlex.split(fetch.split("then", 1)[1].split(";")[0])
    assert command[0] == "chattts-server"
    assert "$MODEL" in command  # the build argument, as given
    cfg = config_from_args([a.replace("$MODEL", "2Noise/ChatTTS") for a in command[1:]])
    assert cfg.download_only and not cfg.model.allow_unverified
    # Fetched as the app user, after USER, into a folder the app user owns.
    assert text.index("USER 10001") < text.index(f"RUN {fetch}")
    cache = _hub_cache(name)
    assert re.search(rf"chown app:app [^\n]*{re.escape(cache)}", text)
    # The base deployment's cache emptyDir is mounted at HOME/.cache: it must not hide it.
    mounts = [m["mountPath"] for m in server_container(render(OVERLAYS["gpu"]))["volumeMounts"]]
    home_cache = [m for m in mounts if m.endswith("/.cache")]
    assert home_cache and not any(cache.startswith(m + "/") for m in home_cache)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_dockerfile_examples_run_the_official_weights(name: str) -> None:
    text = (DOCKER / name).read_text()
    assert "--build-arg MODEL=2Noise/ChatTTS" in text
    assert f":{_hub_cache(name)}" in text, "a cache volume example at the image's HF_HUB_CACHE"
    assert "--model 2Noise/ChatTTS" in text


def test_gpu_overlay_reads_a_shared_cache_read_only_and_offline() -> None:
    docs = render(OVERLAYS["gpu"])
    c = server_container(docs)
    assert server_config(c).model.model == "2Noise/ChatTTS"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    mount = mounts[_hub_cache("Dockerfile.gpu")]
    assert mount["readOnly"] is True
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    pvc = one(docs, "PersistentVolumeClaim", claim)
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]


def test_the_fill_job_writes_that_cache_with_the_overlays_image() -> None:
    folder = OVERLAYS["gpu"]
    (job,) = load_yaml_docs(folder / "job-fill-models.yaml")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert "job-fill-models.yaml" not in (folder / "kustomization.yaml").read_text()
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    cfg = config_from_args(c["args"])
    assert cfg.download_only and cfg.model.model == "2Noise/ChatTTS"
    mount = {m["mountPath"]: m for m in c["volumeMounts"]}[_hub_cache("Dockerfile.gpu")]
    assert not mount.get("readOnly", False)
    volumes = {v["name"]: v for v in spec["volumes"]}
    server_docs = render(folder)
    pvc = one(server_docs, "PersistentVolumeClaim")
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert c["image"] == server_container(server_docs)["image"], "its server pins the revision"
    assert (
        spec["securityContext"]["runAsUser"]
        == pod_spec(server_docs)["securityContext"]["runAsUser"]
    )


def test_gpu_weights_overlay_serves_the_image_s_weights_with_no_volume() -> None:
    docs = render(OVERLAYS["gpu-weights"])
    c = server_container(docs)
    assert server_config(c).model.model == "2Noise/ChatTTS"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert _hub_cache("Dockerfile.gpu") not in [m["mountPath"] for m in c["volumeMounts"]]
    kustomization = (OVERLAYS["gpu-weights"] / "kustomization.yaml").read_text()
    assert "--build-arg MODEL=2Noise/ChatTTS" in kustomization


def test_compose_shows_the_official_weights_with_a_cache_volume() -> None:
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    assert "chattts-hf" in compose["volumes"]
    for service in compose["services"].values():
        assert f"chattts-hf:{_hub_cache('Dockerfile.cpu')}" in service["volumes"]
    commented = [
        json.loads(line.split("# command:", 1)[1])
        for line in (DOCKER / "docker-compose.yml").read_text().splitlines()
        if line.strip().startswith("# command:") and '"--model",' in line
    ]
    assert len(commented) == 2, "one commented --model command per service"
    for command in commented:
        assert config_from_args(command).model.model == "2Noise/ChatTTS"


def test_the_pin_is_a_full_commit() -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", PINNED_REVISIONS["2Noise/ChatTTS"])
