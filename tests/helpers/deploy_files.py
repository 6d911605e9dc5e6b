"""The deployment files under deploy/ as the tests read them: where they are, the ports and the
drain margin they must agree on, and a minimal kustomize.

The kustomize overlays are rendered by a small loader here, not by the kustomize binary. It
implements only what the kustomizations use (resources, namespace, images, and `patches` of
JSON 6902 operations with a kind/name target) and fails on any other key, so it cannot drift
silently from kustomize's meaning (test_deploy_manifests.py compares it with `kubectl kustomize`
where kubectl is installed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from chattts_server.config_cli import config_from_args

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKER = DEPLOY / "docker"
OVERLAYS = {name: K8S / "overlays" / name for name in ("cpu", "gpu", "gpu-weights")}
GRPC_PORT = 50051
HTTP_PORT = 8000
METRICS_PORT = 9090
# Seconds between the end of --grace-s and SIGKILL for cancelling leftovers and exiting.
EXIT_MARGIN_S = 10


# ---------------------------------------------------------------------------------------------
# A minimal kustomize: exactly the features deploy/k8s uses.

_KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}


def _pointer(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    *head, last = _pointer(path)
    node = doc
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node, last


def apply_json_patch(doc: dict, ops: list[dict]) -> None:
    """RFC 6902 add/remove/replace/test, in place; raises on a missing path or a failed test."""
    for op in ops:
        parent, key = _parent(doc, op["path"])
        kind = op["op"]
        index: int | str = key
        if isinstance(parent, list):
            if kind == "add":
                parent.insert(len(parent) if key == "-" else int(key), op["value"])
                continue
            index = int(key)
            assert 0 <= index < len(parent), f"{op['path']}: index out of range"
        elif kind != "add":
            assert key in parent, f"{op['path']}: no such member"
        if kind in ("add", "replace"):
            parent[index] = op["value"]
        elif kind == "remove":
            del parent[index]
        elif kind == "test":
            assert parent[index] == op["value"], f"JSON patch test failed at {op['path']}"
        else:
            raise AssertionError(f"unsupported JSON patch op {kind!r}")


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _set_image(containers: list[dict], images: list[dict]) -> None:
    for c in containers:
        name = re.split(r"[:@]", c["image"], maxsplit=1)[0]
        for img in images:
            if img["name"] == name:
                c["image"] = f"{img.get('newName', name)}:{img['newTag']}"


def render(folder: Path) -> list[dict]:
    """What `kustomize build folder` gives for the subset of kustomize that deploy/k8s uses."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(k) - _KUSTOMIZATION_KEYS
    assert not unknown, (
        f"{folder}: kustomization keys the test loader does not implement: {unknown}"
    )
    docs: list[dict] = []
    for entry in k.get("resources", []):
        path = folder / entry
        docs += render(path) if path.is_dir() else load_yaml_docs(path)
    for patch in k.get("patches", []):
        assert set(patch) == {"path", "target"}, f"{folder}: only path+target patches: {patch}"
        assert set(patch["target"]) <= {"kind", "name"}, patch["target"]
        ops = yaml.safe_load((folder / patch["path"]).read_text())
        assert isinstance(ops, list), f"{patch['path']}: expected JSON 6902 operations"
        targets = [
            d
            for d in docs
            if d["kind"] == patch["target"]["kind"]
            and d["metadata"]["name"] == patch["target"].get("name", d["metadata"]["name"])
        ]
        assert len(targets) == 1, f"{patch}: matches {len(targets)} objects"
        apply_json_patch(targets[0], ops)
    if "namespace" in k:
        for d in docs:
            if d["kind"] not in _CLUSTER_SCOPED:
                d["metadata"]["namespace"] = k["namespace"]
    for d in docs:
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for field in ("containers", "initContainers"):
            _set_image(pod.get(field, []), k.get("images", []))
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def server_container(docs: list[dict]) -> dict:
    containers = pod_spec(docs)["containers"]
    assert len(containers) == 1
    return containers[0]


def server_config(container: dict):
    assert "command" not in container, "the image's ENTRYPOINT (chattts-server) must be kept"
    return config_from_args([str(a) for a in container["args"]])


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
