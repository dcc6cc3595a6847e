"""deploy/ without a cluster: schemas, references between the objects, and what they promise."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from benchmarks.vllm_cpu import VLLM_VERSION
from tests.deploy.crd_schemas import CRDS
from tests.deploy.manifests import (
    DEPLOY,
    ROOT,
    Kustomization,
    container_port,
    gateway_config,
    gateway_container,
    kustomization_files,
    kustomizations,
    parse_promql,
    pod_specs,
    prometheus_queries,
)

# A recent Kubernetes release whose schemas kubernetes-validate bundles.
K8S_VERSION = "1.33"
ALL = kustomizations()
IDS = [k.name for k in ALL]


def _validate(doc: dict[str, Any]) -> None:
    crd = CRDS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        jsonschema.Draft202012Validator(crd).validate(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_both_patterns_are_there() -> None:
    assert {"standalone", "sidecar"} <= set(IDS)


def test_kustomizations_list_existing_files_and_every_file_is_listed() -> None:
    listed: set[Path] = set()
    assert [k.path for k in ALL] == kustomization_files()
    for k in ALL:
        path = k.path
        listed.add(path.resolve())
        assert k.spec["kind"] == "Kustomization"
        for resource in k.spec["resources"]:
            target = (path.parent / resource).resolve()
            assert target.exists(), f"{path}: resource {resource} does not exist"
            listed.add(target)
    files = {p.resolve() for p in DEPLOY.rglob("*") if p.is_file()}
    assert files - listed == set(), "files in deploy/ no kustomization lists"


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_every_document_validates_against_its_schema(k: Kustomization) -> None:
    assert k.documents
    for doc in k.documents:
        _validate(doc)


def test_the_validators_reject_a_misspelt_field() -> None:
    k = ALL[IDS.index("sidecar")]
    for kind, path in (("Deployment", ("spec", "template", "spec")), ("ScaledObject", ("spec",))):
        doc = copy.deepcopy(k.one(kind))
        node = doc
        for key in path:
            node = node[key]
        node["terminationGracePeriodSecond" if kind == "Deployment" else "maxReplicas"] = 1
        with pytest.raises(jsonschema.ValidationError):
            _validate(doc)
    monitor = copy.deepcopy(k.one("ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        _validate(monitor)
    scaled = copy.deepcopy(k.one("ScaledObject"))
    del scaled["spec"]["triggers"][0]["metadata"]["query"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(scaled)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_services_monitors_and_budgets_select_what_exists(k: Kustomization) -> None:
    pods = [(w, s) for w, s in pod_specs(k)]
    for svc in k.of_kind("Service"):
        selected = [
            (w, s)
            for w, s in pods
            if _selects(svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
        ]
        assert selected, f"Service {svc['metadata']['name']} selects no pods"
        for port in svc["spec"]["ports"]:
            for _, spec in selected:
                names = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
                assert port["targetPort"] in names
    for pdb in k.of_kind("PodDisruptionBudget"):
        assert any(
            _selects(
                pdb["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"]
            )
            for w, _ in pods
        )
    for mon in k.of_kind("ServiceMonitor"):
        services = [
            s for s in k.of_kind("Service")
            if _selects(mon["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]  # fmt: skip
        assert len(services) == 1
        for ep in mon["spec"]["endpoints"]:
            assert ep["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
            assert ep["path"] == "/metrics"


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_gateway_probes_and_port_match_its_config(k: Kustomization) -> None:
    cfg = gateway_config(k)  # strict: an unknown or mistyped key fails here
    assert cfg.server.host == "0.0.0.0"  # the kubelet probes the pod's address
    assert cfg.telemetry.metrics_enabled
    _, c = gateway_container(k)
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container_port(c, c[probe]["httpGet"]["port"]) == cfg.server.port


def _sleep_s(container: dict[str, Any]) -> int:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_the_grace_period_covers_the_drain(k: Kustomization) -> None:
    drain = gateway_config(k).server.drain_timeout_s
    spec, gw = gateway_container(k)
    gateway_done = _sleep_s(gw) + drain
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > gateway_done
    for other in spec["containers"]:
        if other is not gw:
            # Beside the gateway, the model server outlives the drain, and the grace period it.
            assert _sleep_s(other) > gateway_done
            assert grace > _sleep_s(other)


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dockerfile_user() -> str:
    users = re.findall(r"^USER\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert users
    return users[-1]


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_gateway_container_runs_the_image_locked_down(k: Kustomization) -> None:
    spec, c = gateway_container(k)
    assert c["image"] == f"llm-gateway:{_pyproject()['project']['version']}"
    ctx = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    assert ctx["runAsNonRoot"] is True
    assert f"{ctx['runAsUser']}:{ctx['runAsGroup']}" == _dockerfile_user()
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert "memory" in c["resources"]["limits"]


def _arg(container: dict[str, Any], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in container["args"] if a.startswith(flag + "="))


def _vllm(k: Kustomization) -> tuple[dict[str, Any], dict[str, Any]]:
    found = [(w, c) for w, s in pod_specs(k) for c in s["containers"] if c["name"] == "vllm"]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_vllm_is_the_version_the_project_tests(k: Kustomization) -> None:
    _, c = _vllm(k)
    assert c["image"] == f"vllm/vllm-openai:v{VLLM_VERSION}"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_sidecar_gateway_fronts_its_own_vllm_on_loopback() -> None:
    k = ALL[IDS.index("sidecar")]
    cfg = gateway_config(k)
    _, vllm = _vllm(k)
    assert _arg(vllm, "--host") == "127.0.0.1"  # nothing reaches vLLM but the gateway
    assert [r.url for r in cfg.replicas] == [f"http://127.0.0.1:{_arg(vllm, '--port')}"]


def test_standalone_lists_each_statefulset_pod_keda_may_start() -> None:
    k = ALL[IDS.index("standalone")]
    cfg = gateway_config(k)
    sts, vllm = _vllm(k)
    assert sts["kind"] == "StatefulSet"
    headless = k.one("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    so = k.one("ScaledObject")
    name, port = sts["metadata"]["name"], _arg(vllm, "--port")
    wanted = [
        f"http://{name}-{i}.{headless['metadata']['name']}:{port}"
        for i in range(so["spec"]["maxReplicaCount"])
    ]
    assert [r.url for r in cfg.replicas] == wanted


@pytest.mark.parametrize("k", ALL, ids=IDS)
def test_scaled_object_targets_the_model_server_on_several_signals(k: Kustomization) -> None:
    so = k.one("ScaledObject")
    ref = so["spec"]["scaleTargetRef"]
    target = k.one(ref["kind"], ref["name"])
    assert target["apiVersion"] == ref["apiVersion"]
    assert any(c["name"] == "vllm" for c in target["spec"]["template"]["spec"]["containers"])
    assert 1 <= so["spec"]["minReplicaCount"] < so["spec"]["maxReplicaCount"]
    queries = prometheus_queries(k)
    assert len(queries) >= 3 and len(queries) == len(so["spec"]["triggers"])
    metrics = {s.metric for _, q in queries for s in parse_promql(q).selectors}
    for needed in ("llm_request_queue_depth", "llm_gateway_replica_kv_cache_usage_ratio",
                   "llm_gateway_time_to_first_token_seconds_bucket"):  # fmt: skip
        assert needed in metrics
    # Each query reads the job Prometheus gives the gateway's Service (its ServiceMonitor's).
    (monitored,) = [
        s["metadata"]["name"]
        for s in k.of_kind("Service")
        for m in k.of_kind("ServiceMonitor")
        if _selects(m["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    model = _arg(_vllm(k)[1], "--served-model-name")
    for name, query in queries:
        for sel in parse_promql(query).selectors:
            assert sel.matchers.get("job") == ("=", monitored), f"trigger {name}: {sel}"
            if "model" in sel.matchers:
                assert sel.matchers["model"] == ("=", model), f"trigger {name}"


def test_dockerfile_copies_every_package_and_runs_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.findall(r"^FROM\s+(\S+)", text, re.M)[-1] == "python:3.11-slim"
    copied = set(re.findall(r"^COPY\s+(\w+)\s", text, re.M))
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    assert packages <= copied, "a package pip install . needs is not copied"
    user = _dockerfile_user()
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user)  # numeric: runAsNonRoot can check it
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv"} <= ignored
    assert not packages & ignored
