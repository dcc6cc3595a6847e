"""deploy/ against a running gateway: its TOML serves, its probes answer, its metrics exist.

Each kustomization's gateway TOML runs in-process in front of a simulated fleet serving the
manifests' model (only the replica list, the address and a saturating profile differ), so
the admission queue, TTFT histogram and KV-cache gauge all have series when /metrics is read.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from gateway.config import GatewayConfig, ReplicaConfig
from gateway.process import running_gateway
from simulator import SimConfig, SimFleet
from tests.deploy.manifests import (
    Exposition,
    Kustomization,
    gateway_config,
    gateway_container,
    kustomizations,
    matches,
    parse_exposition,
    parse_promql,
    pod_specs,
    prometheus_queries,
)
from tests.gateway.conftest import ONE_EACH, eventually, hold, holding

ALL = kustomizations()
IDS = [k.name for k in ALL]
# Labels Prometheus adds to every scraped series (target labels), not the gateway.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}


def _model(k: Kustomization) -> str:
    args = next(c["args"] for _, s in pod_specs(k) for c in s["containers"] if c["name"] == "vllm")
    return next(a.split("=", 1)[1] for a in args if a.startswith("--served-model-name="))


def _local(cfg: GatewayConfig, fleet: SimFleet) -> GatewayConfig:
    return replace(
        cfg,
        server=replace(cfg.server, host="127.0.0.1", port=0),
        routing=ONE_EACH,
        replicas=tuple(ReplicaConfig(url=r.url, name=r.name) for r in fleet.replicas),
    )


def missing(exposition: Exposition, query: str) -> list[str]:
    """What a query names that the exposition lacks: metrics, matched series, labels."""
    parsed = parse_promql(query)
    problems: list[str] = []
    labels_seen: set[str] = set()
    for sel in parsed.selectors:
        family = exposition.family_of(sel.metric)
        if family is None:
            problems.append(f"metric {sel.metric}")
            continue
        own = {k: v for k, v in sel.matchers.items() if k not in TARGET_LABELS}
        series = [labels for name, labels in exposition.samples if name == sel.metric]
        labels_seen.update(label for labels in series for label in labels)
        if not any(matches(labels, own) for labels in series):
            problems.append(f"no series {sel.metric}{own}")
    problems.extend(f"label {label}" for label in parsed.grouping_labels - labels_seen)
    return problems


@pytest.mark.parametrize("k", ALL, ids=IDS)
async def test_deployed_config_serves_probes_and_every_queried_metric(k: Kustomization) -> None:
    model = _model(k)
    sim = SimConfig(model=model, time_scale=20.0, kv_events=False, seed=7)
    async with (
        SimFleet(sim, replicas=2, host="127.0.0.1", base_port=0) as fleet,
        running_gateway(_local(gateway_config(k), fleet)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as c,
    ):
        _, container = gateway_container(k)
        for probe in ("readinessProbe", "livenessProbe"):
            r = await c.get(container[probe]["httpGet"]["path"])
            assert r.status_code == 200, probe

        release = asyncio.Event()
        body, started = holding(2000, model), list[int]()
        holders = [asyncio.create_task(hold(c, body, release, started)) for _ in fleet.replicas]
        await eventually(lambda: len(started) == len(fleet.replicas), what="every replica busy")
        quick = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        waiting = asyncio.create_task(c.post("/v1/chat/completions", json=quick))
        assert gw.runtime.admission is not None
        queue = gw.runtime.admission.queue
        await eventually(lambda: len(queue) == 1, what="a request queued")
        text = (await c.get("/metrics")).text
        release.set()
        assert (await waiting).status_code == 200
        await asyncio.gather(*holders)

    exposition = parse_exposition(text)
    queries = prometheus_queries(k)
    assert queries
    for name, query in queries:
        assert missing(exposition, query) == [], f"trigger {name}"
    # The check itself tells a real name from a near miss.
    assert missing(exposition, "sum(llm_gateway_in_flight_requests_count)")
    assert missing(exposition, 'sum(llm_request_queue_depth{bucket="le64"})')
    assert missing(exposition, "sum by (zone) (llm_gateway_in_flight_requests)")
