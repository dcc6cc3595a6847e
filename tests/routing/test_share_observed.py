"""Picks another gateway process made, counted by the share window as if made here."""

from __future__ import annotations

import dataclasses

from routing import BUILTIN_PROFILES, ReplicaSnapshot, RequestFeatures
from routing.router import Router
from routing.share import ShareWindow
from tests.routing.replicas import MODEL, replica

NAMES = ("a", "b", "c", "d")


def _fleet() -> list[ReplicaSnapshot]:
    return [replica(n, cache_capacity_tokens=528 * 32) for n in NAMES]


def _router(seed: int) -> Router:
    default = BUILTIN_PROFILES["default"]
    params = {**default.picker.params, "seed": seed}
    return Router(
        dataclasses.replace(default, picker=dataclasses.replace(default.picker, params=params))
    )


def _new(g: int) -> RequestFeatures:
    """A new conversation on a prefix of its own (nothing held anywhere)."""
    blocks = tuple(range(100 * g, 100 * g + 20))
    return RequestFeatures(model=MODEL, block_hashes=blocks, block_tokens=32, prompt_tokens=640)


def test_an_observed_pick_counts_as_a_recorded_one_but_is_not_this_process_s_last() -> None:
    here, there = ShareWindow(8, join_slack=1.0), ShareWindow(8, join_slack=1.0)
    here.record("a", True, None)
    here.observe("b", True, 7)
    there.record("a", True, None)
    there.record("b", True, 7)
    assert here.counts(_fleet()) == there.counts(_fleet()) == [1, 1, 0, 0]
    assert here.last == (True, None) and there.last == (True, 7)
    joins, same = here.joins(_fleet()), there.joins(_fleet())
    assert joins is not None and same is not None
    assert joins.evenly(range(4), [0.0] * 4, 4.0) == same.evenly(range(4), [0.0] * 4, 4.0)


def test_a_router_without_a_window_has_nothing_to_share() -> None:
    router = Router(BUILTIN_PROFILES["round_robin"])
    router.route(_new(0), _fleet())
    assert router.last_share() is None
    router.observe("a", True, None)  # ignored: no window to count it in


def test_two_routers_that_count_each_other_s_picks_place_new_prefixes_as_one() -> None:
    # Same seed: alone, each places its first new prefix on the same replica as the other.
    alone = [_router(3), _router(3)]
    placed = [alone[g % 2].route(_new(g), _fleet()).replica.name for g in range(4)]
    assert placed[0] == placed[1] and len(set(placed)) < 4
    # Each told the other's picks: four new prefixes on four replicas, as one router places them.
    shared = [_router(3), _router(3)]
    placed = []
    for g in range(8):
        here, there = shared[g % 2], shared[1 - g % 2]
        name = here.route(_new(g), _fleet()).replica.name
        last = here.last_share()
        assert last == (True, None)
        there.observe(name, *last)
        placed.append(name)
    assert sorted(placed[:4]) == sorted(NAMES) and sorted(placed[4:]) == sorted(NAMES)
