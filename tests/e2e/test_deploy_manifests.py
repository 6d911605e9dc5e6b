"""Deployment files under deploy/: the Kubernetes manifests and ingress examples, Envoy and
HAProxy. Offline and fast; the Docker files are in test_deploy_docker.py.

The kustomize overlays are rendered by the minimal loader in tests/helpers/deploy_files.py. Where
kubectl is installed, one test compares its output with `kubectl kustomize`. Every rendered
object is validated against the Kubernetes 1.30 OpenAPI schemas bundled with
kubernetes-validate (strict: unknown fields fail), then checked against the server's real
command-line parser and the facts the probes, drain and autoscaling depend on.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from chattts_server.api.voices import VoiceLibrary
from deploy_files import (
    DEPLOY,
    DOCKER,
    EXIT_MARGIN_S,
    GRPC_PORT,
    HTTP_PORT,
    K8S,
    METRICS_PORT,
    OVERLAYS,
    apply_json_patch,
    by_kind,
    load_yaml_docs,
    one,
    pod_spec,
    render,
    selects,
    server_config,
    server_container,
)

K8S_VERSION = "1.30"
METRIC = "chattts_active_streams"
# The startup probe must allow model load + warm-up (and, on a GPU, compilation).
MIN_STARTUP_BUDGET_S = 300


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, render(OVERLAYS[request.param])


# ---------------------------------------------------------------------------------------------
# Kubernetes


def test_loader_applies_json_patch_like_rfc6902():
    doc = {"a": [1, 2], "b": {"c": 1}}
    apply_json_patch(
        doc,
        [
            {"op": "test", "path": "/b/c", "value": 1},
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "add", "path": "/a/0", "value": 0},
            {"op": "replace", "path": "/b/c", "value": 2},
            {"op": "remove", "path": "/a/1"},
            {"op": "add", "path": "/d~1e", "value": True},
        ],
    )
    assert doc == {"a": [0, 2, 3], "b": {"c": 2}, "d/e": True}
    for bad in (
        {"op": "test", "path": "/b/c", "value": 3},
        {"op": "replace", "path": "/nope", "value": 1},
        {"op": "remove", "path": "/a/9"},
    ):
        with pytest.raises((AssertionError, KeyError)):
            apply_json_patch(copy.deepcopy(doc), [bad])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (built-in kustomize) absent")
@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_loader_matches_kubectl_kustomize(name):
    out = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS[name])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout

    def key(d: dict) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=key)
    assert sorted(render(OVERLAYS[name]), key=key) == theirs


def test_every_object_validates_against_kubernetes_schema(overlay):
    name, docs = overlay
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert "HorizontalPodAutoscaler" in kinds
    for d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{name}: {d['kind']}/{d['metadata']['name']}: {where}: {err.message}")
        assert d["metadata"].get("namespace") == "chattts", d["metadata"]["name"]


def test_probes_use_grpc_health_on_the_server_port(overlay):
    _, docs = overlay
    c = server_container(docs)
    cfg = server_config(c)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == cfg.network.port == GRPC_PORT
    assert ports["http"] == cfg.network.http_port == HTTP_PORT
    assert ports["metrics"] == cfg.network.metrics_port == METRICS_PORT
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = c[probe]
        assert set(spec) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
        assert spec["grpc"]["port"] == GRPC_PORT, probe
        assert spec["grpc"].get("service", "") == "", probe  # whole-server health
    startup = c["startupProbe"]
    budget_s = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget_s >= MIN_STARTUP_BUDGET_S, "startup probe too short for model load + warm-up"


def test_termination_grace_covers_prestop_and_server_drain(overlay):
    _, docs = overlay
    c = server_container(docs)
    cfg = server_config(c)
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2
    prestop_s = float(command[1])
    assert prestop_s > 0, "endpoints need a moment to be removed before SIGTERM"
    period_s = pod_spec(docs)["terminationGracePeriodSeconds"]
    assert cfg.admission.grace_s > 0
    assert period_s >= prestop_s + cfg.admission.grace_s + EXIT_MARGIN_S, (
        f"terminationGracePeriodSeconds {period_s} < preStop {prestop_s} + "
        f"--grace-s {cfg.admission.grace_s} + margin {EXIT_MARGIN_S}"
    )


def test_pod_runs_non_root_with_read_only_root_fs(overlay):
    _, docs = overlay
    spec = pod_spec(docs)
    c = server_container(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    for path in ("/tmp", "/home/app/.cache"):  # the image's only writable paths (Dockerfiles)
        assert "emptyDir" in volumes[mounts[path]], path
    cfg = server_config(c)
    assert str(cfg.voices_dir) in mounts
    assert (
        volumes[mounts[str(cfg.voices_dir)]]["configMap"]["name"]
        == one(docs, "ConfigMap")["metadata"]["name"]
    )


def test_hpa_scales_the_deployment_on_active_streams(overlay):
    _, docs = overlay
    deployment = one(docs, "Deployment")
    hpa = one(docs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (
        deployment["apiVersion"],
        "Deployment",
        deployment["metadata"]["name"],
    )
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == METRIC
    target = metric["pods"]["target"]
    assert target["type"] == "AverageValue"
    max_streams = server_config(server_container(docs)).engine.max_streams
    assert 0 < float(target["averageValue"]) < max_streams, "scale out before pods are full"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_pdb_and_services_select_the_server_pods(overlay):
    _, docs = overlay
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
    container_ports = {p["name"]: p["containerPort"] for p in server_container(docs)["ports"]}
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    headless = services["chattts-stream-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    assert not headless.get("publishNotReadyAddresses", False), "only ready pods in DNS"
    assert services["chattts-stream"]["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert services["chattts-stream"]["spec"].get("clusterIP") != "None"
    for svc in services.values():
        assert selects(svc["spec"]["selector"], pod_labels), svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in container_ports, port
            assert port["port"] == container_ports[port["targetPort"]], port
        grpc_ports = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
        assert grpc_ports and grpc_ports[0]["port"] == GRPC_PORT
        http_ports = [p for p in svc["spec"]["ports"] if p["name"] == "http"]
        assert http_ports and http_ports[0]["port"] == HTTP_PORT, "the HTTP door's Service port"


@pytest.mark.parametrize("name", ["gpu", "gpu-weights"])
def test_gpu_overlays_request_a_gpu_and_serve_the_official_weights(name):
    """Where the weights come from, volume or image: test_deploy_weights.py."""
    c = server_container(render(OVERLAYS[name]))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert c["image"].endswith("-gpu" if name == "gpu" else "-gpu-weights")
    cfg = server_config(c)
    assert (cfg.model.device, cfg.model.dtype) == ("cuda", "float16")
    assert cfg.model.model == "2Noise/ChatTTS" and cfg.model.model_dir is None


def test_cpu_overlay_requests_no_gpu_and_runs_the_dev_model():
    docs = render(OVERLAYS["cpu"])
    c = server_container(docs)
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    assert "tolerations" not in pod_spec(docs)
    assert c["image"].endswith("-cpu")
    cfg = server_config(c)
    assert (cfg.model.device, cfg.model.gguf_format) == ("cpu", "auto")
    assert cfg.model.model_dir is None and cfg.model.dev_model == "tiny"


def test_base_alone_requests_one_gpu_per_replica():
    c = server_container(render(K8S / "base"))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_voice_presets_load_and_match_the_docker_examples(tmp_path):
    data = one(render(K8S / "base"), "ConfigMap", "chattts-voices")["data"]
    docker_voices = {p.name: p.read_text() for p in (DOCKER / "voices").glob("*.json")}
    assert data and data == docker_voices
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    assert VoiceLibrary(tmp_path).reload() == len(data), "a preset failed to load"


def test_monitoring_files_agree_with_the_manifests():
    docs = render(K8S / "base")
    adapter = yaml.safe_load((K8S / "monitoring" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["name"]["as"] == METRIC and METRIC in rule["seriesQuery"]
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    # A CRD (monitoring.coreos.com): not in the kustomizations, so not schema-validated;
    # kubernetes-validate has no schema for it. Checked structurally instead.
    (monitor,) = load_yaml_docs(K8S / "monitoring" / "servicemonitor.yaml")
    assert monitor["kind"] == "ServiceMonitor"
    selected = [
        s
        for s in by_kind(docs, "Service")
        if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    port_names = {e["port"] for e in monitor["spec"]["endpoints"]}
    with_port = [s for s in selected if port_names & {p["name"] for p in s["spec"]["ports"]}]
    assert len(with_port) == 1, "each pod must be scraped through exactly one Service"


def test_envoy_balances_http2_per_stream_with_grpc_health_and_retries():
    config = yaml.safe_load((DEPLOY / "envoy" / "envoy.yaml").read_text())
    (cluster,) = config["static_resources"]["clusters"]
    assert cluster["type"] == "STRICT_DNS" and cluster["lb_policy"] == "ROUND_ROBIN"
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"]
    (check,) = cluster["health_checks"]
    assert "grpc_health_check" in check
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    docs = render(OVERLAYS["gpu"])
    headless = one(docs, "Service", "chattts-stream-headless")["metadata"]
    assert address["address"] == f"{headless['name']}.{headless['namespace']}.svc.cluster.local"
    assert address["port_value"] == GRPC_PORT
    (listener,) = config["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    (route,) = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert route["route"]["cluster"] == cluster["name"]
    assert route["route"]["timeout"] == "0s", "a route timeout would cut long streams"
    assert "unavailable" in route["route"]["retry_policy"]["retry_on"].split(",")


def test_envoy_file_says_it_is_unverified():
    header = (DEPLOY / "envoy" / "envoy.yaml").read_text().split("static_resources:")[0]
    assert "UNVERIFIED" in header


INGRESS = K8S / "ingress" / "ingress-nginx.yaml"
STREAM_TIMEOUT_S = 3600  # idle timeouts long enough for a stream waiting on an LLM


def test_ingress_examples_reach_both_doors_with_stream_timeouts():
    docs = [d for d in yaml.safe_load_all(INGRESS.read_text()) if d]
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    services = {s["metadata"]["name"]: s for s in by_kind(render(OVERLAYS["gpu"]), "Service")}
    ingresses = {d["metadata"]["name"]: d for d in docs}
    assert set(ingresses) == {"chattts-stream-http", "chattts-stream-grpc"}
    for name, door in (("chattts-stream-http", "http"), ("chattts-stream-grpc", "grpc")):
        ingress = ingresses[name]
        notes = ingress["metadata"]["annotations"]
        (rule,) = ingress["spec"]["rules"]
        (path,) = rule["http"]["paths"]
        backend = path["backend"]["service"]
        assert backend["port"]["name"] == door
        ports = {p["name"] for p in services[backend["name"]]["spec"]["ports"]}
        assert door in ports, f"{name}: Service {backend['name']} has no port {door}"
        for key in ("proxy-read-timeout", "proxy-send-timeout"):
            assert int(notes[f"nginx.ingress.kubernetes.io/{key}"]) >= STREAM_TIMEOUT_S, key
    http = ingresses["chattts-stream-http"]["metadata"]["annotations"]
    assert http["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    grpc_notes = ingresses["chattts-stream-grpc"]["metadata"]["annotations"]
    assert grpc_notes["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert int(grpc_notes["nginx.ingress.kubernetes.io/grpc-read-timeout"]) >= STREAM_TIMEOUT_S


HAPROXY = {name: DEPLOY / "haproxy" / name for name in ("haproxy.cfg", "haproxy-plain.cfg")}


def _haproxy_lines(name: str) -> list[str]:
    return [ln.split("#")[0].strip() for ln in HAPROXY[name].read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(HAPROXY))
def test_haproxy_files_balance_both_doors_per_stream_with_stream_timeouts(name):
    lines = _haproxy_lines(name)
    assert lines.count("balance leastconn") == 2
    assert "option redispatch 1" in lines and any(ln.startswith("retry-on ") for ln in lines)
    for timeout in ("client", "server", "tunnel"):
        assert f"timeout {timeout} 1h" in lines, timeout
    servers = [ln for ln in lines if ln.startswith("server ")]
    assert len(servers) == 6 and sum(" proto h2 " in ln for ln in servers) == 3
    assert all(" check" in ln for ln in servers)
    if shutil.which("haproxy"):
        done = subprocess.run(
            ["haproxy", "-c", "-f", str(HAPROXY[name])], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_haproxy_checks_readiness_on_the_http_door():
    lines = _haproxy_lines("haproxy.cfg")
    assert lines.count("http-check send meth GET uri /health ver HTTP/1.1 hdr Host chattts") == 2
    grpc_servers = [ln for ln in lines if ln.startswith("server ") and " proto h2 " in ln]
    assert all("check port" in ln and "check-proto h1" in ln for ln in grpc_servers)
    assert "httpchk" not in " ".join(_haproxy_lines("haproxy-plain.cfg"))


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_manifests_size_threads_to_the_cpu_request(overlay: str) -> None:
    deployment = one(render(OVERLAYS[overlay]), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    request = float(container["resources"]["requests"]["cpu"])
    limit = container["resources"].get("limits", {}).get("cpu")
    threads = server_config(container).model.threads
    # Without a CPU limit there is no quota to size from: the manifest must say it.
    assert threads == int(request) if limit is None else threads in (0, int(float(limit)))
