"""One /metrics scraper per replica for gateways sharing one Redis, counted on the replicas'
side: the budget holds fleet-wide, every gateway sees the load, a dead owner is replaced, and
while Redis is down each gateway scrapes on its own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace

import httpx

from gateway.config import GatewayConfig, ScoreLoopConfig
from gateway.runtime import Runtime
from gateway.shared_state.scrapes import ScrapeLeases
from simulator import SimFleet
from tests.gateway.conftest import InProcessGateway, eventually, hold, holding, in_process
from tests.gateway.shared_state.conftest import shared_config
from tests.gateway.shared_state.helpers import chat, shared, up_gauge
from tests.redis_server import RedisServer

# A cadence that wants 20 scrapes a second of every replica: the budget is what binds.
BUDGET = 2.0
EAGER = ScoreLoopConfig(
    scrape_interval_s=0.05,
    steady_scrape_interval_s=0.05,
    idle_scrape_interval_s=0.05,
    max_scrapes_per_s=BUDGET,
)
# Quick enough for the tests to see several scrapes a second, the budget out of the way.
QUICK = ScoreLoopConfig(
    scrape_interval_s=0.05, steady_scrape_interval_s=0.2, idle_scrape_interval_s=0.2,
    max_scrapes_per_s=20.0,
)  # fmt: skip


def _config(
    fleet: SimFleet, redis: RedisServer, loop: ScoreLoopConfig, **shared_keys: object
) -> GatewayConfig:
    return replace(shared_config(fleet, redis, **shared_keys), score_loop=loop)


def _leases(runtime: Runtime) -> ScrapeLeases:
    assert runtime.shared_state is not None and runtime.shared_state.scrapes is not None
    return runtime.shared_state.scrapes


def _settled(runtimes: list[Runtime]) -> bool:
    """Every replica scraped by exactly one process, each knows which, none beyond its share."""
    names = set(runtimes[0].pool.replicas)
    owned = [_leases(rt).owned for rt in runtimes]
    now = time.monotonic()
    fair = -(-len(names) // len(runtimes))
    return (
        all(_leases(rt).sharing(now) for rt in runtimes)
        and sum(len(o) for o in owned) == len(names)
        and set().union(*owned) == names
        and all(len(o) <= fair for o in owned)
    )


def _renders(fleet: SimFleet) -> dict[str, int]:
    return {r.name: r.engine.stats.renders for r in fleet.replicas}


@contextlib.asynccontextmanager
async def _hosts(cfg: GatewayConfig, hosts: int, workers: int) -> AsyncIterator[list[Runtime]]:
    """`hosts` gateways of `workers` processes each, all on one Redis (no front ends)."""
    async with contextlib.AsyncExitStack() as stack:
        runtimes = []
        for _ in range(hosts):
            for index in range(workers):
                rt = Runtime(cfg, worker_index=index, worker_count=workers)
                await rt.start()
                stack.push_async_callback(rt.stop)
                runtimes.append(rt)
        yield runtimes


async def _steady_rate(
    fleet: SimFleet,
    runtimes: list[Runtime],
    scrapes: Callable[[Runtime, str], bool],
    pick: Callable[[Iterable[int]], int],
) -> float:
    """Renders per second of the replica `pick` chooses, over a window of steady state."""
    # The scrapers' budgets first spend the burst their buckets start with.
    await eventually(
        lambda: all(
            pace.budget.ready_at(rt._scores._bounds, time.monotonic()) > time.monotonic()
            for rt in runtimes
            for name, pace in rt._scores._paces.items()
            if scrapes(rt, name)
        ),
        timeout=20.0,
        what="the burst spent",
    )
    before, start = _renders(fleet), time.monotonic()
    await asyncio.sleep(3.0)  # a measurement window, not a synchronisation
    after, elapsed = _renders(fleet), time.monotonic() - start
    return pick(after[n] - before[n] for n in before) / elapsed


async def test_two_gateways_of_two_workers_scrape_each_replica_within_one_budget(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    async with _hosts(_config(fleet4, redis_server, EAGER, scrape_lease_ttl_s=3.0), 2, 2) as rts:
        await eventually(lambda: _settled(rts), timeout=10.0, what="leases settled")
        # Spread: four processes, four replicas, one each.
        assert all(len(_leases(rt).owned) == 1 for rt in rts)
        sent = [{r.name: r.scrapes_total for r in rt.pool} for rt in rts]
        rate = await _steady_rate(fleet4, rts, lambda rt, n: n in _leases(rt).owned, max)
        # One scraper at the whole budget; before, each host's two workers split it and each
        # host paid it in full (2 x BUDGET). A scrape in flight at each end of the window.
        assert rate <= BUDGET + 2 / 3.0, rate
        assert _settled(rts)
        # Every process sees each replica's load, however many of them scrape it.
        release = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(httpx.AsyncClient(base_url=r.url, timeout=10.0))
                for r in fleet4.replicas
            ]
            holds = [asyncio.create_task(hold(c, holding(4000), release)) for c in clients]
            try:
                await eventually(
                    lambda: all(
                        r.metrics is not None and (r.metrics.running or 0.0) >= 1.0
                        for rt in rts
                        for r in rt.pool
                    ),
                    timeout=10.0,
                    what="every process sees the load",
                )
            finally:
                release.set()
                await asyncio.gather(*holds, return_exceptions=True)
        # Since the leases settled, each process scraped only the replica it owns.
        for rt, before in zip(rts, sent, strict=True):
            others = {r.name: r.scrapes_total for r in rt.pool if r.name not in _leases(rt).owned}
            assert others == {n: before[n] for n in others}
        # /metrics says so: one lease each, and the others' results applied here.
        for rt in rts:
            text = rt.metrics.render().decode()
            assert "llm_gateway_shared_state_scrape_leases 1.0" in text
            applied = next(
                x for x in text.splitlines()
                if x.startswith("llm_gateway_shared_state_scrapes_applied_total ")
            )  # fmt: skip
            assert float(applied.split()[1]) > 0


async def test_unshared_the_same_fleet_is_scraped_by_every_host(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    # The contrast: share_scrapes off, each host's workers split the budget, each host pays it.
    cfg = _config(fleet4, redis_server, EAGER, share_scrapes=False)
    async with _hosts(cfg, 2, 2) as rts:
        rate = await _steady_rate(fleet4, rts, lambda _rt, _name: True, min)
        assert rate > BUDGET + 2 / 3.0, rate


@contextlib.asynccontextmanager
async def _two(
    cfg: GatewayConfig,
) -> AsyncIterator[tuple[InProcessGateway, InProcessGateway, contextlib.AsyncExitStack]]:
    """Two gateways; closing the stack handed out stops the first alone."""
    async with contextlib.AsyncExitStack() as outer:
        inner = await outer.enter_async_context(contextlib.AsyncExitStack())
        a = await inner.enter_async_context(in_process(cfg))
        b = await outer.enter_async_context(in_process(cfg))
        yield a, b, inner


async def test_a_dead_owners_replicas_are_taken_over_within_the_lease_ttl(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    ttl = 1.0
    cfg = _config(fleet4, redis_server, QUICK, scrape_lease_ttl_s=ttl)
    async with _two(cfg) as (a, b, a_stack):
        rts = [a.runtime, b.runtime]
        await eventually(lambda: _settled(rts), timeout=10.0, what="leases settled")
        orphans = _leases(a.runtime).owned
        assert len(orphans) == 2  # two processes, four replicas: two each
        # Killed: no word to Redis, its leases stay until they lapse.
        shared(a).abandon()
        killed = time.monotonic()
        await a_stack.aclose()
        leases_b, names = _leases(b.runtime), set(b.runtime.pool.replicas)
        await eventually(lambda: leases_b.owned == names, timeout=3 * ttl, what="takeover")
        # The lease lapses a TTL after the last renewal; a claim comes each quarter TTL.
        assert time.monotonic() - killed < ttl + ttl / 4 + 1.0
        pool = b.runtime.pool
        sent = {n: pool[n].scrapes_total for n in orphans}
        renders = _renders(fleet4)
        await eventually(
            lambda: (
                all(pool[n].scrapes_total > sent[n] for n in orphans)
                and all(_renders(fleet4)[n] > renders[n] for n in orphans)
            ),
            what="the orphans scraped again",
        )
        assert all(pool[n].freshness_now() == 1.0 for n in orphans)
        r = await b.client.post("/v1/chat/completions", json=chat("after", 1))
        assert r.status_code == 200


async def test_a_stopped_owner_hands_its_replicas_over_at_the_next_claim(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    ttl = 30.0  # far longer than the test: only the release can hand them over
    cfg = _config(fleet4, redis_server, QUICK, scrape_lease_ttl_s=ttl)
    async with _two(cfg) as (a, b, a_stack):
        await eventually(lambda: _settled([a.runtime, b.runtime]), timeout=10.0, what="settled")
        await a_stack.aclose()
        leases_b, names = _leases(b.runtime), set(b.runtime.pool.replicas)
        # Its place among the scrapers is gone too: b's fair share is every replica at once.
        await eventually(lambda: leases_b.owned == names, timeout=ttl / 2, what="handover")


async def test_redis_down_each_gateway_scrapes_alone_and_sharing_resumes(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    cfg = _config(fleet4, redis_server, QUICK, reconnect_max_s=0.2)
    async with _two(cfg) as (a, b, _):
        gws, rts = [a, b], [a.runtime, b.runtime]
        await eventually(lambda: _settled(rts), timeout=10.0, what="leases settled")
        await _applied_again(rts, "results applied")
        redis_server.stop()
        await eventually(lambda: all(up_gauge(g) == 0.0 for g in gws), timeout=5, what="down")
        # The leases Redis granted stand until their TTL; after it nobody is known to share.
        await eventually(
            lambda: not any(_leases(rt).sharing(time.monotonic()) for rt in rts),
            timeout=5,
            what="the last claims' TTL passed",
        )
        sent = [{r.name: r.scrapes_total for r in rt.pool} for rt in rts]
        await eventually(
            lambda: all(
                r.scrapes_total > before[r.name]
                for rt, before in zip(rts, sent, strict=True)
                for r in rt.pool
            ),
            timeout=5,
            what="every gateway scrapes every replica itself",
        )
        for gw in gws:
            r = await gw.client.post("/v1/chat/completions", json=chat("down", 1))
            assert r.status_code == 200
        redis_server.restart()
        await eventually(lambda: all(up_gauge(g) == 1.0 for g in gws), timeout=5, what="up")
        await eventually(lambda: _settled(rts), timeout=10.0, what="sharing resumed")
        await _applied_again(rts, "results applied again")


async def _applied_again(rts: list[Runtime], what: str) -> None:
    applied = [_leases(rt).stats.applied for rt in rts]
    await eventually(
        lambda: all(_leases(rt).stats.applied > n for rt, n in zip(rts, applied, strict=True)),
        what=what,
    )
