"""Prefixes in flight shared: a new prefix one process has in flight is followed by the others."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.config import RoutingConfig
from gateway.shared_state.inflight import SharedInflight
from routing import BUILTIN_PROFILES
from simulator import SimFleet
from tests.gateway.conftest import eventually, set_faults
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import chat, decisions, shared
from tests.redis_server import RedisServer

SYSTEM = "Group 7 handbook: answer from the rules below. " + " ".join(
    f"rule-{i}." for i in range(200)
)


def _inflight(wakes: list[int] | None = None) -> SharedInflight:
    told = wakes if wakes is not None else []
    shared_map = SharedInflight(64, 3.0, 1024, lambda: told.append(1))
    shared_map.sharing = True
    return shared_map


def test_own_starts_and_ends_are_told_in_order_and_theirs_only_held() -> None:
    wakes: list[int] = []
    m = _inflight(wakes)
    m.add(5, "r0", (1, 2, 3))
    m.remove(5)
    m.add(5, "r1", (1, 2))  # an id reused: a new request
    assert m.drain() == [[5, "r0", [1, 2, 3]], [5], [5, "r1", [1, 2]]] and len(wakes) == 3
    assert m.apply("other", [[9, "r2", [1, 2, 3, 4]]], {"r2"}) == 0
    assert m.match((1, 2, 3, 4)) == {"r1": 2, "r2": 4}
    # The others' entries are never told back.
    assert m.drain() == [] and m.remote_count() == 1
    m.apply("other", [[9]], {"r2"})
    assert m.match((1, 2, 3, 4)) == {"r1": 2} and m.remote_count() == 0


def test_theirs_expire_after_the_ttl_and_go_with_the_link() -> None:
    m = _inflight()
    m.apply("dead", [[1, "r0", [7, 8]]], {"r0"})
    m.expire(m._remote[("dead", 1)][1] + 2.9)
    assert m.match((7, 8)) == {"r0": 2}
    m.expire(m._remote[("dead", 1)][1] + 3.0)  # its process died: no end will come
    assert m.match((7, 8)) == {} and len(m) == 0
    m.apply("other", [[2, "r0", [7]]], {"r0"})
    m.add(3, "r1", (7,))
    m.lost()
    assert m.match((7,)) == {"r1": 1} and m.drain() == []
    m.remove(3)  # told before the link went down: the others dropped it with theirs
    assert m.drain() == [] and len(m) == 0


def test_bad_events_are_counted_unknown_replicas_skipped_and_nothing_told_while_down() -> None:
    m = _inflight()
    bad = m.apply("o", [[1, "r0", ["x"]], "junk", [1, 2, 3, 4], [2, "gone", [1]]], {"r0"})
    assert bad == 3 and len(m) == 0
    m.sharing = False
    m.add(4, "r0", (1,))
    m.remove(4)
    assert m.drain() == [] and len(m) == 0


async def test_b_follows_a_new_prefix_a_has_in_flight(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    # Without a first byte nothing is recorded: only the in-flight start can tell b.
    for r in fleet4.replicas:
        await set_faults(r.url, stall_seconds=2.0)
    default = BUILTIN_PROFILES["default"]
    # Every in-flight match a holder (no KV-share scaling): the test is about sharing them.
    params = {**default.picker.params, "full_allowance_share": None}
    profile = replace(default, picker=replace(default.picker, params=params), name="following")
    routing = RoutingConfig(profile="following", profiles={"following": profile})
    cfg = replace(shared_config(fleet4, redis_server), routing=routing)
    async with gateways(cfg) as (a, b):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q a"}]
        body = {**chat("a", 1), "messages": messages}
        first = asyncio.create_task(a.client.post("/v1/chat/completions", json=body))
        await eventually(lambda: shared(b).inflight.remote_count() == 1, what="told")
        (placed,) = [r.name for r in a.runtime.pool if r.in_flight]
        for r in fleet4.replicas:
            await set_faults(r.url, stall_seconds=0.0)
        before = decisions(b)
        messages[1] = {"role": "user", "content": "q b"}
        got = await b.client.post("/v1/chat/completions", json={**body, "messages": messages})
        assert got.status_code == 200, got.text
        moved = [k for k, n in decisions(b).items() if n > before.get(k, 0.0)]
        assert moved == [(placed, "prefix_hit")]
        assert (await first).status_code == 200
        await eventually(lambda: shared(b).inflight.remote_count() == 0, what="ended")
        # /metrics says so: a told its start, b applied it and holds none now.
        told = a.runtime.metrics.render().decode()
        held = b.runtime.metrics.render().decode()
        assert "llm_gateway_shared_state_inflight_published_total 1.0" in told
        assert "llm_gateway_shared_state_inflight_applied_total 1.0" in held
        assert "llm_gateway_shared_state_remote_inflight 0.0" in held
