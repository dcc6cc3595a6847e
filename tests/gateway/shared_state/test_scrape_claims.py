"""The scrape lease scripts on a real Redis: one owner per replica, shares spread, a lapsed or
released lease taken over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.shared_state.scrapes import preference
from gateway.shared_state.scripts import ALL, SHAS, Keys
from tests.redis_server import RedisServer

KEYS = Keys("claims")
REPLICAS = [f"r{i}" for i in range(8)]


@pytest.fixture
async def r(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    for text in ALL.values():
        await client.script_load(text)
    try:
        yield client
    finally:
        await client.aclose()


async def _claim(r: aioredis.Redis, pid: str, lease_ms: int = 60_000) -> set[str]:
    held = await r.evalsha(
        SHAS["claim"], 1, KEYS.scrapers, pid, lease_ms, KEYS.scrape_base,
        *preference(pid, REPLICAS),
    )  # fmt: skip
    return {name.decode() for name in held}


async def _owners(r: aioredis.Redis) -> dict[str, str | None]:
    values = await r.mget([KEYS.scrape_base + name for name in REPLICAS])
    return {name: v.decode() if v else None for name, v in zip(REPLICAS, values, strict=True)}


async def _rounds(r: aioredis.Redis, pids: list[str], n: int = 3) -> dict[str, set[str]]:
    held: dict[str, set[str]] = {}
    for _ in range(n):
        for pid in pids:
            held[pid] = await _claim(r, pid)
    return held


async def test_alone_a_process_holds_every_lease(r: aioredis.Redis) -> None:
    assert await _claim(r, "a") == set(REPLICAS)
    assert set((await _owners(r)).values()) == {"a"}
    assert 0 < await r.pttl(KEYS.scrape_base + "r0") <= 60_000


async def test_processes_that_join_share_the_replicas_one_owner_each(r: aioredis.Redis) -> None:
    await _claim(r, "a")
    for pids in (["a", "b"], ["a", "b", "c"]):
        held = await _rounds(r, pids)
        owners = await _owners(r)
        # Every replica has exactly one owner, and it knows it.
        assert all(owners[name] is not None for name in REPLICAS)
        for pid, names in held.items():
            assert names == {n for n, o in owners.items() if o == pid}
        # Spread: nobody holds more than its fair share (ceil(8 / processes)).
        fair = -(-len(REPLICAS) // len(pids))
        assert all(0 < len(names) <= fair for names in held.values()), held


async def test_a_released_or_lapsed_lease_is_taken_over(r: aioredis.Redis) -> None:
    await _rounds(r, ["a", "b"])
    await r.evalsha(SHAS["release"], 1, KEYS.scrapers, "a", KEYS.scrape_base, *REPLICAS)
    assert set((await _owners(r)).values()) == {"b", None}
    assert await _claim(r, "b") == set(REPLICAS)  # alone again: its fair share is all
    # A process that dies holds its leases (and its place among the scrapers) for a TTL.
    await _claim(r, "c", lease_ms=200)
    await _claim(r, "b")
    await _claim(r, "c", lease_ms=200)
    taken = {n for n, o in (await _owners(r)).items() if o == "c"}
    assert taken and len(taken) <= 4
    # Polled: c's leases lapse on Redis's clock, and the next claim of b takes them.
    deadline = time.monotonic() + 5.0
    while (held := await _claim(r, "b")) != set(REPLICAS):
        assert time.monotonic() < deadline, held
        await asyncio.sleep(0.01)
    assert set((await _owners(r)).values()) == {"b"}
