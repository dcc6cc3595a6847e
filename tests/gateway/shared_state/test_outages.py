"""Redis stopped, restarted empty, or paused: requests never fail, sharing comes back alone."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from gateway.config import GatewayConfig
from gateway.proxy.tenancy_config import TenancyConfig, TenantConfig
from simulator import SimFleet
from tests.gateway.conftest import InProcessGateway, eventually, set_faults
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import chat, routed, shared, store, up_gauge
from tests.redis_server import RedisServer


async def _load(gws: list[InProcessGateway], stop: asyncio.Event, statuses: list[int]) -> None:
    i = 0
    while not stop.is_set():
        gw = gws[i % len(gws)]
        r = await gw.client.post("/v1/chat/completions", json=chat(f"load-{i % 16}", 1))
        statuses.append(r.status_code)
        i += 1


async def test_redis_restarted_empty_under_load(
    fleet4: SimFleet, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llm_gateway.shared_state")
    cfg = shared_config(fleet4, redis_server, reconnect_max_s=0.2)
    async with gateways(cfg) as gws:
        a, b = gws
        stop, statuses = asyncio.Event(), list[int]()
        loads = [asyncio.create_task(_load(gws, stop, statuses)) for _ in range(4)]
        await eventually(lambda: len(statuses) >= 20, what="load")
        redis_server.stop()
        await eventually(lambda: up_gauge(a) == 0.0 and up_gauge(b) == 0.0, what="down", timeout=5)
        served_while_down = len(statuses)
        await eventually(lambda: len(statuses) >= served_while_down + 20, what="load while down")
        redis_server.restart()
        await eventually(
            lambda: up_gauge(a) == 1.0 and up_gauge(b) == 1.0, what="up again", timeout=5
        )
        await eventually(lambda: len(statuses) >= served_while_down + 40, what="load after")
        stop.set()
        await asyncio.gather(*loads)
        assert statuses and set(statuses) == {200}
        # Sharing resumed: a session A starts now, B follows.
        first, _ = await routed(a, chat("after", 1), {"x-session-id": "after"})
        sessions = b.runtime.affinity.sessions
        await eventually(lambda: sessions.get("after", time.monotonic()) == first, what="mirror")
        assert await routed(b, chat("after", 2), {"x-session-id": "after"}) == (first, "session")
        downs = shared(a).stats.downs + shared(b).stats.downs
    messages = [r.getMessage() for r in caplog.records]
    # One line per outage and process, however many failed calls each outage had (a loaded
    # machine may time out one more call after the restart: a second, short outage).
    assert downs >= 2 and sum("shared state down" in m for m in messages) == downs
    assert sum("shared state up again" in m for m in messages) == downs


KEY = "sk-acme"


def _tenant_config(fleet: SimFleet, redis: RedisServer, **keys: object) -> GatewayConfig:
    base = shared_config(fleet, redis, **keys)
    acme = TenantConfig(keys=(KEY,), requests_per_minute=100_000)
    return replace(base, tenancy=TenancyConfig(tenants={"acme": acme}))


async def test_redis_paused_requests_wait_at_most_the_op_timeout(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    op_timeout = 0.02
    cfg = _tenant_config(
        fleet4, redis_server, op_timeout_s=op_timeout, reconnect_max_s=0.1, late_grace_s=0.1
    )
    headers = {"authorization": f"Bearer {KEY}"}
    async with gateways(cfg) as gws:
        stores = [store(gw) for gw in gws]
        for gw in gws:
            r = await gw.client.post("/v1/chat/completions", json=chat("x", 1), headers=headers)
            assert r.status_code == 200
        for s in stores:
            s.max_wait_s = 0.0
        admin = aioredis.Redis.from_url(redis_server.url)
        try:
            await admin.client_pause(1500, all=True)
            for i in range(20):
                gw = gws[i % 2]
                r = await gw.client.post(
                    "/v1/chat/completions", json=chat(f"p{i}", 1), headers=headers
                )
                assert r.status_code == 200
            assert all(up_gauge(gw) == 0.0 for gw in gws)
            assert all(s.fallbacks > 0 for s in stores)
            # The only Redis wait on a request's path: bounded by op_timeout_s (+ loop slack).
            assert max(s.max_wait_s for s in stores) < op_timeout + 0.05
            await eventually(lambda: all(up_gauge(gw) == 1.0 for gw in gws), what="up", timeout=5)
        finally:
            await admin.aclose()


async def test_redis_late_for_less_than_the_grace_keeps_sharing_up(
    fleet4: SimFleet, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llm_gateway.shared_state")
    op_timeout = 0.02
    cfg = _tenant_config(fleet4, redis_server, op_timeout_s=op_timeout, late_grace_s=10.0)
    headers = {"authorization": f"Bearer {KEY}"}
    async with gateways(cfg) as gws:
        stores = [store(gw) for gw in gws]
        admin = aioredis.Redis.from_url(redis_server.url)
        try:
            # Every round trip is late while Redis is paused: each request decides alone...
            await admin.client_pause(2500, all=True)
            paused = time.monotonic()
            for i in range(6):
                gw = gws[i % 2]
                r = await gw.client.post(
                    "/v1/chat/completions", json=chat(f"late{i}", 1), headers=headers
                )
                assert r.status_code == 200
            assert time.monotonic() - paused < 2.5, "the pause ended before the requests did"
            assert all(s.fallbacks > 0 for s in stores)
            assert all(shared(gw).stats.late_ops > 0 for gw in gws)
            # ...but the link stays up: no process drops the shared view for one late answer.
            assert all(up_gauge(gw) == 1.0 for gw in gws)
            await admin.ping()  # answered once the pause is over
            before = [s.fallbacks for s in stores]
            r = await gws[0].client.post(
                "/v1/chat/completions", json=chat("after", 1), headers=headers
            )
            assert r.status_code == 200 and stores[0].fallbacks == before[0]
        finally:
            await admin.aclose()
        assert all(shared(gw).stats.downs == 0 for gw in gws)
    assert not any("shared state down" in r.getMessage() for r in caplog.records)


async def test_two_gateways_refuse_at_the_shared_rpm_limit(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    base = shared_config(fleet4, redis_server, op_timeout_s=0.5)
    acme = TenantConfig(keys=(KEY,), requests_per_minute=6)
    cfg = replace(base, tenancy=TenancyConfig(tenants={"acme": acme}))
    headers = {"authorization": f"Bearer {KEY}"}
    async with gateways(cfg) as gws:
        codes = []
        for i in range(12):
            r = await gws[i % 2].client.post(
                "/v1/chat/completions", json=chat(f"q{i}", 1), headers=headers
            )
            codes.append(r.status_code)
        assert codes.count(200) == 6 and codes.count(429) == 6
        assert all(store(gw).fallbacks == 0 for gw in gws)


async def test_a_dead_gateways_quota_slots_and_lease_expire(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    for r in fleet4.replicas:
        await set_faults(r.url, stall_after_tokens=1, stall_seconds=2.5)
    lease = 1.0
    base = shared_config(fleet4, redis_server, op_timeout_s=0.5, lease_ttl_s=lease)
    acme = TenantConfig(keys=(KEY,), max_concurrent=2)
    cfg = replace(base, tenancy=TenancyConfig(tenants={"acme": acme}))
    headers = {"authorization": f"Bearer {KEY}"}
    body = {**chat("long", 1), "stream": True}
    async with gateways(cfg) as (a, b):
        streams = [
            asyncio.create_task(a.client.post("/v1/chat/completions", json=body, headers=headers))
            for _ in range(2)
        ]
        pool_b = b.runtime.pool
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 2, what="remote")
        refused = await b.client.post("/v1/chat/completions", json=chat("b", 1), headers=headers)
        assert refused.status_code == 429  # A's two slots count here too
        # A dies: no goodbye to Redis, its requests still open.
        shared(a).abandon()
        died = time.monotonic()
        # Up, too: B going down (a slow beat on a loaded machine) also reads as 0 in flight.
        await eventually(
            lambda: shared(b).up and sum(r.remote_in_flight for r in pool_b) == 0,
            what="lease",
            timeout=lease + 1,
        )
        assert time.monotonic() - died < lease + 0.5
        assert sum(r.in_flight for r in a.runtime.pool) == 2  # still running at A
        served = await b.client.post("/v1/chat/completions", json=chat("b", 1), headers=headers)
        assert served.status_code == 200  # the dead process's slots were freed
        admin = aioredis.Redis.from_url(redis_server.url)
        try:
            pid = shared(a).process_id
            assert await admin.exists(f"llmgw:inflight:{pid}") == 0
        finally:
            await admin.aclose()
        await asyncio.gather(*streams)
