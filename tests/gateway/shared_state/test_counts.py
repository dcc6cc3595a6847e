"""In-flight counts pushed with the flush: the others see a start and an end without a beat."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import ReplicaConfig
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState
from gateway.shared_state.counts import LocalCounts, RemoteCounts
from simulator import SimFleet
from tests.gateway.conftest import eventually, set_faults
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import chat, shared
from tests.redis_server import RedisServer


def _pool() -> ReplicaPool:
    names = ("r0", "r1")
    return ReplicaPool({n: ReplicaState(ReplicaConfig(f"http://{n}.test:80", n)) for n in names})


def _lease(pid: str, version: int, **counts: int) -> list[bytes | list[bytes]]:
    flat = [b"", str(version).encode()]
    for name, n in counts.items():
        flat += [name.encode(), str(n).encode()]
    return [pid.encode(), flat]


def test_local_counts_push_each_change_once_under_a_new_version() -> None:
    pool, wakes = _pool(), []
    local = LocalCounts(pool, lambda: wakes.append(1))
    pool.on_in_flight = local.changed  # as the shared state wires it
    assert local.take() is None
    pool.acquire("r0")
    assert local.dirty and wakes == [1]  # the pool's hook
    assert local.take() == [1, {"r0": 1}] and local.take() is None
    lease = pool.acquire("r1")
    lease.release(True)
    assert local.take() is None  # back where the last push left it: nothing to tell
    local.lost()
    assert local.take() == [1, {"r0": 1}]  # the link came back: told again


def test_an_older_lease_never_undoes_a_newer_push_and_the_dead_go() -> None:
    pool = _pool()
    remote = RemoteCounts(pool, ttl_s=3.0)
    assert remote.pushed("a", [4, {"r0": 2}], now=10.0)
    assert remote.beat([1, *_lease("a", 3, r0=5)], sent_at=10.1, now=10.2) == 1
    assert pool["r0"].remote_in_flight == 2  # the lease predates the push
    remote.beat([2, *_lease("a", 5, r1=1), *_lease("b", -1, r0=1)], sent_at=10.3, now=10.4)
    assert (pool["r0"].remote_in_flight, pool["r1"].remote_in_flight) == (1, 1)
    assert not remote.pushed("a", [6, {"r0": -1}], now=10.5)  # malformed: ignored
    assert not remote.pushed("a", ["6", {}], now=10.5)
    # "a" pushes after the beat was sent: kept though the beat's answer lacks it.
    remote.pushed("a", [6, {"r1": 3}], now=10.6)
    remote.beat([1, *_lease("b", -1, r0=1)], sent_at=10.5, now=10.7)
    assert pool["r1"].remote_in_flight == 3
    remote.beat([0], sent_at=10.8, now=10.9)  # both leases ran out
    assert pool["r0"].remote_in_flight == pool["r1"].remote_in_flight == 0
    remote.pushed("c", [1, {"r0": 4}], now=11.0)
    remote.expire(13.9)
    assert pool["r0"].remote_in_flight == 4
    remote.expire(14.0)  # no beat answered for a lease TTL: gone
    assert pool["r0"].remote_in_flight == 0


async def test_another_process_start_and_end_arrive_with_its_flush_not_a_beat(
    fleet4: SimFleet, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for r in fleet4.replicas:
        await set_faults(r.url, stall_after_tokens=1, stall_seconds=1.0)
    # Beats 8 s apart: whatever b learns of a's requests in the test's seconds, a flush told it.
    slow = {"inflight_idle_poll_s": 8.0, "lease_ttl_s": 17.0, "scrape_lease_ttl_s": 17.0}
    async with gateways(shared_config(fleet4, redis_server, **slow)) as (a, b):
        state_b, pool_a, pool_b = shared(b), a.runtime.pool, b.runtime.pool
        # b's beat that saw a (its first, or the next one 8 s later).
        await eventually(lambda: state_b.stats.peers == 1, what="b's beat", timeout=10.0)
        beats = [0]
        beat = state_b._beat

        async def counted() -> None:
            beats[0] += 1
            await beat()

        monkeypatch.setattr(state_b, "_beat", counted)
        body = {**chat("counted", 1), "stream": True}
        stream = asyncio.create_task(a.client.post("/v1/chat/completions", json=body))
        await eventually(lambda: sum(r.in_flight for r in pool_a) == 1, what="a's start")
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 1, what="pushed")
        assert beats[0] == 0 and [r.remote_in_flight for r in pool_b] == [
            r.in_flight for r in pool_a
        ]
        assert (await stream).status_code == 200
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 0, what="ended")
        # a stops with a request still running: its goodbye clears its counts at b at once.
        stream = asyncio.create_task(a.client.post("/v1/chat/completions", json=body))
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 1, what="pushed 2")
        await shared(a).stop()
        await eventually(lambda: sum(r.remote_in_flight for r in pool_b) == 0, what="goodbye")
        assert beats[0] == 0
        await stream
