"""Last writer wins (locally and in Redis), bounded state, bootstrap, and sharing off."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson
import pytest
import redis.asyncio as aioredis

from cache_index.session_affinity import session_hash
from gateway.config import CacheIndexConfig, GatewayConfig
from gateway.shared_state.config import SharedStateConfig
from gateway.shared_state.scripts import ALL, SHAS, Keys
from routing.types import RequestFeatures
from simulator import SimFleet
from tests.gateway.conftest import MODEL, eventually, gateway_config, in_process
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import chat, routed, shared
from tests.redis_server import RedisServer

KEYS = Keys("llmgw")
TTLS = {
    "prompts": CacheIndexConfig().prompt_cache_ttl_s,
    "sessions": CacheIndexConfig().session_ttl_s,
}


async def test_redis_rejects_a_stale_write(redis_server: RedisServer) -> None:
    r = aioredis.Redis.from_url(redis_server.url)
    try:
        await r.script_load(ALL["merge"])
        values, versions = KEYS.tier("sessions")

        async def write(version: int, replica: str) -> list[int]:
            args = (0, 100, 60_000, "42", str(version), replica)
            out: list[int] = await r.evalsha(SHAS["merge"], 2, values, versions, *args)
            return out

        assert await write(2_000_000_000_000_000, "sim-1") == [1, 0]
        assert await write(1_999_999_999_999_999, "sim-2") == [0, 1]  # older: refused
        assert await r.hget(values, "42") == b"sim-1"
        assert await write(2_000_000_000_000_001, "sim-3") == [1, 0]
        assert await r.hget(values, "42") == b"sim-3"
        assert await r.zscore(versions, "42") == 2_000_000_000_000_001
    finally:
        await r.aclose()


async def test_an_older_outcome_does_not_overwrite_a_later_local_decision(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    async with gateways(shared_config(fleet4, redis_server), n=1) as (b,):
        mine, _ = await routed(b, chat("s", 1), {"x-session-id": "s"})
        other = next(r.name for r in b.runtime.pool if r.name != mine)
        state = shared(b)
        key = session_hash("s")
        r = aioredis.Redis.from_url(redis_server.url)
        try:
            old = int((time.time() - 5) * 1e6)
            msg = {"o": "elsewhere", "e": [[old, other, None, key, []]]}
            await r.publish(KEYS.channel, orjson.dumps(msg))
            await eventually(lambda: state.mirror.stats.stale == 1, what="stale outcome")
            assert b.runtime.affinity.sessions.get("s", time.monotonic()) == mine
            new = int((time.time() + 1) * 1e6)
            msg = {"o": "elsewhere", "e": [[new, other, None, key, []]]}
            await r.publish(KEYS.channel, orjson.dumps(msg))
            await eventually(lambda: state.mirror.stats.applied == 1, what="newer outcome")
            assert b.runtime.affinity.sessions.get("s", time.monotonic()) == other
        finally:
            await r.aclose()


def _features(i: int, blocks: int = 20) -> RequestFeatures:
    start = 1000 + i * blocks
    return RequestFeatures(
        model=MODEL,
        prompt_hash=i + 1,
        session=f"s{i}",
        block_hashes=tuple(range(start, start + blocks)),
    )


async def test_state_is_bounded_in_redis_and_in_each_process(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    caps = {"max_prompts": 50, "max_sessions": 40, "max_blocks_per_replica": 100}
    cfg = shared_config(fleet4, redis_server, max_event_blocks=8, **caps)
    cfg = replace(cfg, cache_index=CacheIndexConfig(max_prompts=30, max_sessions=30))
    replica = fleet4.replicas[0].name
    async with gateways(cfg) as (a, b):
        sa, sb = shared(a), shared(b)
        for i in range(300):
            sa.on_record(_features(i), replica)
        await eventually(lambda: sa.stats.published == 300, what="published")
        await eventually(lambda: sb.mirror.stats.applied == 300, what="applied")
        r = aioredis.Redis.from_url(redis_server.url)
        try:
            for tier, cap in (("prompts", 50), ("sessions", 40)):
                values, versions = KEYS.tier(tier)
                assert await r.hlen(values) == cap and await r.zcard(versions) == cap
                ttl_s = TTLS[tier]
                assert 0 < await r.pttl(values) <= ttl_s * 1000
            # The newest entries are the ones kept.
            assert await r.hget(KEYS.tier("prompts")[0], "300") == replica.encode()
            assert await r.hget(KEYS.tier("prompts")[0], "1") is None
            placements = KEYS.prefixes(replica)
            assert await r.zcard(placements) == 100
            # The newest placements are kept (hashes intact), each at its outcome's version.
            newest = await r.zrange(placements, -8, -1, withscores=True)
            assert [int(h) for h, _ in newest] == list(_features(299).block_hashes[:8])
            assert len({v for _, v in newest}) == 1 and newest[0][1] > 1.7e15
            assert 0 < await r.pttl(placements) <= 600_000
            # No key per entry: a fixed set of bounded keys (and a scrape lease per replica,
            # with the set of processes taking them).
            assert await r.dbsize() <= 8 + len(fleet4.replicas) + 1
        finally:
            await r.aclose()
        # Each process keeps its own bounds; an outcome carries max_event_blocks blocks.
        assert len(b.runtime.affinity.prompts) == 30 and len(b.runtime.affinity.sessions) == 30
        assert b.runtime.affinity.prefixes.match(_features(299).block_hashes) == {replica: 8}


async def test_outcomes_wait_bounded_while_redis_is_down(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    cfg = shared_config(fleet4, redis_server, max_pending=100, reconnect_max_s=0.1)
    replica = fleet4.replicas[0].name
    async with gateways(cfg, n=1) as (a,):
        sa = shared(a)
        redis_server.stop()
        await eventually(lambda: not sa.up, what="down", timeout=5)
        for i in range(250):
            sa.on_record(_features(i), replica)
        assert sa.stats.dropped == 150
        redis_server.restart()
        await eventually(lambda: sa.stats.published == 100, what="the newest 100 sent", timeout=5)


async def test_a_process_started_later_reads_the_shared_state(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    cfg = shared_config(fleet4, redis_server)
    system = "A long shared system prompt about the handbook. " * 20
    async with in_process(cfg) as a:
        first = {}
        for s in ("u1", "u2", "u3"):
            first[s] = (await routed(a, chat(s, 1, system), {"x-session-id": s}))[0]
        await eventually(lambda: shared(a).stats.published == 3, what="published")
        # Started after every outcome was published: only Redis's copy can tell it.
        async with in_process(cfg) as c:
            assert shared(c).mirror.stats.applied == 0
            for s in ("u1", "u2", "u3"):
                assert await routed(c, chat(s, 2, system), {"x-session-id": s}) == (
                    first[s],
                    "session",
                )
            replica, branch = await routed(c, chat("new", 1, system))
            assert branch == "prefix_hit" and replica in first.values()


async def test_without_a_url_the_process_shares_nothing(fleet4: SimFleet) -> None:
    cfg: GatewayConfig = gateway_config(fleet4)
    async with in_process(cfg) as gw:
        assert gw.runtime.shared_state is None and gw.runtime.affinity.on_record is None
        assert type(gw.runtime.tenancy.store).__name__ == "LocalQuotaStore"
        assert b"llm_gateway_shared_state_up" not in gw.runtime.metrics.render()


@pytest.mark.parametrize(
    "keys",
    [
        {"url": "http://127.0.0.1:6379"},
        {"url": "redis://x", "key_prefix": "a b"},
        {"url": "redis://x", "lease_ttl_s": 0.05},
        {"url": "redis://x", "op_timeout_s": 0.0},
        {"url": "redis://x", "max_connections": 1},
        {"url": "redis://x", "inflight_idle_poll_s": 2.0},  # > lease_ttl_s / 2
    ],
)
def test_bad_settings_are_refused(keys: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SharedStateConfig(**keys)  # type: ignore[arg-type]
