"""Two gateways sharing one Redis route as one: sessions, prefixes and in-flight load."""

from __future__ import annotations

import asyncio

from simulator import SimFleet
from tests.gateway.conftest import eventually, set_faults
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import chat, routed, shared
from tests.redis_server import RedisServer


async def test_second_turn_on_b_goes_where_a_sent_the_first(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    async with gateways(shared_config(fleet4, redis_server)) as (a, b):
        sessions = [f"user-{i}" for i in range(8)]
        first = {}
        for s in sessions:
            first[s] = (await routed(a, chat(s, 1), {"x-session-id": s}))[0]
        assert len(set(first.values())) > 1  # spread: a coincidence cannot explain the rest
        await eventually(lambda: shared(b).mirror.stats.applied >= 8, what="mirror")
        for s in sessions:
            replica, branch = await routed(b, chat(s, 2), {"x-session-id": s})
            assert (replica, branch) == (first[s], "session")


LONG_SYSTEM = "You answer questions about the quarterly report in detail. " * 20


async def test_prefix_placed_by_a_is_matched_by_b(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    async with gateways(shared_config(fleet4, redis_server)) as (a, b):
        placed = {}
        for g in range(3):
            system = f"group {g}: {LONG_SYSTEM}"
            placed[g] = (await routed(a, chat(f"first-{g}", 1, system)))[0]
        await eventually(lambda: shared(b).mirror.stats.applied >= 3, what="mirror")
        for g in range(3):
            system = f"group {g}: {LONG_SYSTEM}"
            replica, branch = await routed(b, chat(f"other-{g}", 1, system))
            assert (replica, branch) == (placed[g], "prefix_hit")


async def test_b_sees_the_requests_a_has_in_flight(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    for r in fleet4.replicas:
        await set_faults(r.url, stall_after_tokens=1, stall_seconds=3.0)
    cfg = shared_config(fleet4, redis_server, lease_ttl_s=1.0)
    async with gateways(cfg) as (a, b):
        body = {**chat("long", 1), "stream": True, "max_tokens": 8}
        tasks = [
            asyncio.create_task(a.client.post("/v1/chat/completions", json=body)) for _ in range(3)
        ]
        pool_b = b.runtime.pool
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 3, what="remote")
        ours = {r.name: r.in_flight for r in a.runtime.pool}
        seen = {s.name: s.in_flight for s in pool_b.snapshots()}
        assert seen == ours and sum(seen.values()) == 3
        results = await asyncio.gather(*tasks)
        assert all(r.status_code == 200 for r in results)
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 0, what="released")
