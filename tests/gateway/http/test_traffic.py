"""Traffic management end to end: versions, instance classes and priority over real replicas.

The simulated replicas listen on sockets; the 2,000-request split also goes through the
gateway's own socket (uvicorn), the rest call the app in-process.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from gateway.config import GatewayConfig, ReplicaConfig, RoutingConfig
from gateway.process import running_gateway
from gateway.runtime import Runtime
from gateway.versions_config import ModelVersionsConfig, TrafficConfig
from routing.profile import BUILTIN_PROFILES, PluginSpec
from routing.versions import Version
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, eventually, gateway_config, idle, in_process

CANARY_MODEL = "sim-llama-3-8b-v2"
ONE_TOKEN = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
LABELS = ModelVersionsConfig(
    MODEL,
    (
        Version("v1", 90, "stable", labels={"version": "v1"}),
        Version("v2", 10, "initial", labels={"version": "v2"}),
    ),
)
SERVED = ModelVersionsConfig(
    MODEL,
    (Version("v1", 90, "stable"), Version("v2", 10, "initial", served_model=CANARY_MODEL)),
)


@pytest.fixture
async def fleet3() -> AsyncIterator[SimFleet]:
    async with SimFleet(SIM, replicas=3, host="127.0.0.1", base_port=0) as f:
        yield f


def _labelled(fleet: SimFleet, labels: list[dict[str, str]], **replica: Any) -> GatewayConfig:
    configs = tuple(
        ReplicaConfig(url=r.url, name=r.name, labels=lab, **replica)
        for r, lab in zip(fleet.replicas, labels, strict=True)
    )
    return replace(gateway_config(fleet), replicas=configs)


def _versions_cfg(fleet: SimFleet, **traffic: Any) -> GatewayConfig:
    labels = [{"version": "v1"}, {"version": "v1"}, {"version": "v2"}]
    cfg = _labelled(fleet, labels)
    return replace(cfg, traffic=TrafficConfig(model_versions=(LABELS,), **traffic))


def _served(runtime: Runtime) -> dict[str, int]:
    return {r.name: r.requests_total for r in runtime.pool}


def _version_count(runtime: Runtime, version: str) -> float:
    labels = {"model": MODEL, "version": version}
    sample = runtime.metrics.registry.get_sample_value(
        "llm_gateway_model_version_requests_total", labels
    )
    return sample or 0.0


async def _post_all(c: httpx.AsyncClient, bodies: list[dict[str, Any]], **kw: Any) -> list[Any]:
    """Post every body, 32 at a time; every answer must be a 200."""
    sem = asyncio.Semaphore(32)

    async def one(body: dict[str, Any]) -> Any:
        async with sem:
            r = await c.post("/v1/chat/completions", json=body, **kw)
            assert r.status_code == 200, r.text
            return r.json()

    return await asyncio.gather(*(one(b) for b in bodies))


async def test_2000_requests_split_90_10_within_3_percent(fleet3: SimFleet) -> None:
    async with running_gateway(_versions_cfg(fleet3)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10.0) as c:
            await _post_all(c, [ONE_TOKEN] * 2000)
        served = _served(gw.runtime)
        assert sum(served.values()) == 2000
        canary = served["sim-2"] / 2000
        assert abs(canary - 0.10) <= 0.03, served
        # Both stable replicas took their part: the split is by version, not by replica.
        assert served["sim-0"] > 0 and served["sim-1"] > 0
        assert (_version_count(gw.runtime, "v1"), _version_count(gw.runtime, "v2")) == (
            served["sim-0"] + served["sim-1"],
            served["sim-2"],
        )
        assert idle(gw)


async def test_a_conversation_stays_on_its_version(fleet3: SimFleet) -> None:
    async with in_process(_versions_cfg(fleet3)) as gw:
        before = _served(gw.runtime)
        for conv in range(30):
            headers = {"x-session-id": f"conversation-{conv}"}
            on_canary = []
            for turn in range(4):
                messages = [{"role": "user", "content": f"turn {turn} of {conv}"}]
                body = {**ONE_TOKEN, "messages": messages}
                r = await gw.client.post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200
                now = _served(gw.runtime)
                on_canary.append(now["sim-2"] > before["sim-2"])
                before = now
            assert len(set(on_canary)) == 1, (conv, on_canary)


@pytest.mark.parametrize("allowed", [True, False])
async def test_canary_weight_header_when_allowed(fleet3: SimFleet, allowed: bool) -> None:
    cfg = _versions_cfg(fleet3, allow_canary_header=allowed)
    async with in_process(cfg) as gw:
        await _post_all(gw.client, [ONE_TOKEN] * 100, headers={"x-canary-weight": "100"})
        served = _served(gw.runtime)
        if allowed:
            assert served == {"sim-0": 0, "sim-1": 0, "sim-2": 100}
        else:
            assert served["sim-0"] + served["sim-1"] > 70, served


async def test_a_served_model_version_rewrites_the_model_upstream(fleet: SimFleet) -> None:
    canary = replace(SIM, model=CANARY_MODEL, lora_adapters=())
    async with SimFleet(canary, replicas=1, host="127.0.0.1", base_port=0) as second:
        cfg = gateway_config(fleet, traffic=TrafficConfig(model_versions=(SERVED,)))
        extra = ReplicaConfig(url=second.replicas[0].url, name="canary-0")
        cfg = replace(cfg, replicas=(*cfg.replicas, extra))
        async with in_process(cfg) as gw:
            answers = await _post_all(gw.client, [ONE_TOKEN] * 400)
            models = Counter(a["model"] for a in answers)
            served = _served(gw.runtime)
            # The answer names the served model, as the replica (vLLM) reports it.
            assert models == {
                MODEL: served["sim-0"] + served["sim-1"],
                CANARY_MODEL: 400 - models[MODEL],
            }
            assert served["canary-0"] == models[CANARY_MODEL]
            assert 0.10 - 0.05 <= models[CANARY_MODEL] / 400 <= 0.10 + 0.05, models


def _classes_cfg(fleet: SimFleet, labels: list[dict[str, str]]) -> GatewayConfig:
    default = BUILTIN_PROFILES["default"]
    spec = PluginSpec("length_class", params={"min_prompt_tokens": 200})
    profile = replace(default, name="classes", filters=(*default.filters, spec))
    routing = RoutingConfig(profile="classes", profiles={"classes": profile})
    return replace(_labelled(fleet, labels), routing=routing)


def _branch_count(runtime: Runtime, replica: str, branch: str) -> float:
    labels = {"model": MODEL, "replica": replica, "status": "200", "branch": branch}
    return runtime.metrics.registry.get_sample_value("llm_gateway_requests_total", labels) or 0.0


LONG_PROMPT = {**ONE_TOKEN, "messages": [{"role": "user", "content": "many words here " * 200}]}


async def test_a_long_prompt_reaches_the_long_context_class(fleet: SimFleet) -> None:
    cfg = _classes_cfg(fleet, [{"class": "long-context"}, {}])
    async with in_process(cfg) as gw:
        await _post_all(gw.client, [LONG_PROMPT] * 10)
        assert _served(gw.runtime) == {"sim-0": 10, "sim-1": 0}
        await _post_all(gw.client, [ONE_TOKEN] * 10)
        assert _served(gw.runtime) == {"sim-0": 10, "sim-1": 10}
        text = gw.runtime.metrics.render().decode()
        assert 'branch="class_fallback"' not in text


async def test_an_empty_class_falls_back_and_says_so(fleet: SimFleet) -> None:
    cfg = _classes_cfg(fleet, [{}, {}])
    async with in_process(cfg) as gw:
        await _post_all(gw.client, [LONG_PROMPT] * 6)
        served = _served(gw.runtime)
        assert sum(served.values()) == 6
        fallbacks = sum(_branch_count(gw.runtime, name, "class_fallback") for name in served)
        assert fallbacks == 6


async def _wait_order(fleet: SimFleet, cfg: GatewayConfig) -> list[str]:
    """Which of a P2 and a later P0 request a busy one-slot replica serves first."""
    scheduler = fleet.replicas[0].engine.scheduler
    async with in_process(cfg) as gw:
        c = gw.client
        # The start-up probe round has a 0.5-s timeout: on busy cores it can miss, and the
        # blocker then meets no healthy replica (503) before the next probe (0.1 s later).
        await eventually(lambda: all(r.healthy for r in gw.runtime.pool), what="healthy")
        blocker_body = {**ONE_TOKEN, "max_tokens": 1000, "ignore_eos": True}
        blocker = asyncio.create_task(c.post("/v1/chat/completions", json=blocker_body))

        # Two full CI runs did not see the blocker running (within 3 s, and 10 s); should it
        # happen again, the message says where it was (answered, or not yet sent on).
        def where() -> str:
            rows = [(r.name, r.healthy, r.in_flight, r.foreign_in_flight) for r in gw.runtime.pool]
            done = blocker.done() and not blocker.cancelled() and blocker.exception() is None
            answer = (blocker.result().status_code, blocker.result().text[:300]) if done else None
            return f"the blocker running (answer {answer}, replicas {rows})"

        try:
            await eventually(lambda: scheduler.num_running == 1 or blocker.done(), timeout=10.0)
        except AssertionError:
            raise AssertionError(f"timed out waiting for {where()}") from None
        assert scheduler.num_running == 1, where()
        order: list[str] = []

        async def send(name: str, priority: str) -> None:
            body = {**ONE_TOKEN, "max_tokens": 2}
            r = await c.post(
                "/v1/chat/completions", json=body, headers={"x-llm-priority": priority}
            )
            assert r.status_code == 200
            order.append(name)

        low = asyncio.create_task(send("P2", "P2"))
        await eventually(lambda: scheduler.num_waiting == 1, what="P2 waiting")
        high = asyncio.create_task(send("P0", "P0"))
        await eventually(lambda: scheduler.num_waiting == 2, what="P0 waiting")
        await asyncio.gather(low, high)
        assert (await blocker).status_code == 200
        return order


@pytest.mark.parametrize("marked", [True, False])
async def test_priority_reaches_a_replica_that_schedules_by_it(marked: bool) -> None:
    # One slot and a slow clock: the two short requests wait behind the blocker, in order.
    sim = replace(SIM, max_num_seqs=1, time_scale=5.0)
    async with SimFleet(sim, replicas=1, host="127.0.0.1", base_port=0) as one:
        cfg = _labelled(one, [{}], priority_scheduling=marked)
        order = await _wait_order(one, cfg)
    # Marked: the classes go as vLLM's `priority` and the P0 request overtakes the P2 one
    # (the default tenant's P1 bound applies: 1 < 2). Unmarked: first come, first served.
    assert order == (["P0", "P2"] if marked else ["P2", "P0"])
