"""Routing picks shared: each process's share window counts the others' picks too."""

from __future__ import annotations

from typing import Any

from gateway.shared_state.picks import SharedPicks
from simulator import SimFleet
from tests.gateway.conftest import MODEL, eventually
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import routed, shared
from tests.redis_server import RedisServer


def _picks(up: list[bool]) -> tuple[SharedPicks, list[tuple[Any, ...]], list[int]]:
    seen: list[tuple[Any, ...]] = []
    wakes: list[int] = []
    picks = SharedPicks(4, lambda: up[0], lambda: wakes.append(1))
    picks.observe = lambda *pick: seen.append(pick)
    return picks, seen, wakes


def test_own_picks_are_told_while_up_and_theirs_counted_when_well_formed() -> None:
    up = [False]
    picks, seen, wakes = _picks(up)
    picks.add("r0", True, None)  # the link is down: nobody to tell
    assert picks.drain() == [] and not wakes
    up[0] = True
    picks.add("r0", True, None)
    picks.add("r1", False, 12)
    assert picks.pending and picks.drain() == [["r0", True, None], ["r1", False, 12]]
    assert picks.told == 2 and len(wakes) == 2 and not picks.pending
    raws = [["r0", True, 5], ["gone", True, None], ["r1", 1, None], ["r1", True, "x"], "junk"]
    assert picks.apply(raws, {"r0", "r1"}) == 3
    assert seen == [("r0", True, 5)] and picks.applied == 1
    for i in range(6):  # a long outage's backlog stays bounded: the newest kept
        picks.add(f"r{i}", True, None)
    assert [p[0] for p in picks.drain()] == ["r2", "r3", "r4", "r5"]


def _new_conversation(i: int) -> dict[str, object]:
    # A system prompt of its own: no prefix in common with another conversation.
    system = f"Conversation {i} rules: " + " ".join(f"c{i}-rule-{k}." for k in range(60))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2}


async def test_new_conversations_alternating_between_two_processes_spread_as_from_one(
    fleet4: SimFleet, redis_server: RedisServer
) -> None:
    async with gateways(shared_config(fleet4, redis_server)) as (a, b):
        placed: list[str] = []
        for i in range(8):
            here, there = (a, b) if i % 2 == 0 else (b, a)
            picks, applied = shared(there).picks, shared(there).picks.applied
            replica, branch = await routed(here, _new_conversation(i))
            assert branch == "miss_by_load"
            placed.append(replica)
            await eventually(lambda p=picks, n=applied: p.applied > n, what="pick counted")
        # Each pick placed by the fewest starts over both processes' picks: every replica one
        # of the first four, one of the next four.
        names = sorted(r.name for r in fleet4.replicas)
        assert sorted(placed[:4]) == names and sorted(placed[4:]) == names, placed
        told = a.runtime.metrics.render().decode()
        assert "llm_gateway_shared_state_picks_published_total 4.0" in told
        assert "llm_gateway_shared_state_picks_applied_total 4.0" in told
