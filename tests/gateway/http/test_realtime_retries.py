"""A failed realtime upgrade is retried on another replica, within the retry budget HTTP uses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from websockets.asyncio.client import connect

from gateway.config import (
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    RoutingConfig,
    ServerConfig,
    UpstreamConfig,
)
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import set_faults
from tests.gateway.http.test_realtime import AUTH, KEY, RT, RT_MODEL, recv, refused


@asynccontextmanager
async def two_replicas(upstream: UpstreamConfig) -> AsyncIterator[RunningGateway]:
    """Two transcription replicas, the first cutting every upgrade's connection (an RST)."""
    async with SimFleet(RT, replicas=2, host="127.0.0.1", base_port=0) as rt:
        await set_faults(rt.replicas[0].url, reset_before_first_byte=True)
        cfg = GatewayConfig(
            server=ServerConfig(port=0, api_keys=(KEY,)),
            upstream=upstream,
            health_check=HealthCheckConfig(interval_s=0.1, timeout_s=0.5),
            # In turn, from the first: the first session's first attempt meets the bad one.
            routing=RoutingConfig(profile="round_robin"),
            replicas=(
                ReplicaConfig(url=rt.replicas[0].url, name="bad"),
                ReplicaConfig(url=rt.replicas[1].url, name="good"),
            ),
        )
        async with running_gateway(cfg) as gw:
            yield gw


def _retries(gw: RunningGateway) -> tuple[float, float]:
    """(attempts abandoned on the bad replica, retries the budget refused)."""
    rows = gw.runtime.metrics.samples(
        ["llm_gateway_upstream_retries", "llm_gateway_retries_refused"]
    )
    bad = sum(
        s.value
        for s in rows.get("llm_gateway_upstream_retries", [])
        if s.labels.get("replica") == "bad"
    )
    refused_ = sum(s.value for s in rows.get("llm_gateway_retries_refused", []))
    return bad, refused_


async def test_a_cut_upgrade_is_retried_on_the_next_replica() -> None:
    async with two_replicas(UpstreamConfig(connect_timeout_s=1.0)) as gw:
        url = gw.url.replace("http://", "ws://") + f"/v1/realtime?model={RT_MODEL}"
        async with connect(url, additional_headers=AUTH) as ws:
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            assert (await recv(ws))["type"] == "session.created"
            assert {r.name: r.in_flight for r in gw.runtime.pool} == {"bad": 0, "good": 1}
        assert _retries(gw) == (1.0, 0.0)


async def test_a_retry_over_the_budget_is_refused_with_the_last_error() -> None:
    # No retry floor and a tiny share of one active session: no retry may start.
    budget = UpstreamConfig(connect_timeout_s=1.0, min_retry_concurrency=0, retry_budget_ratio=0.01)
    async with two_replicas(budget) as gw:
        url = gw.url.replace("http://", "ws://") + f"/v1/realtime?model={RT_MODEL}"
        status, body = await refused(url, additional_headers=AUTH)
        assert status == 502, body
        assert body["error"]["message"] == "The model server could not be reached."
        assert _retries(gw) == (1.0, 1.0)
        assert all(r.in_flight == 0 for r in gw.runtime.pool)
