from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from routing import (
    BUILTIN_PROFILES,
    PLUGINS,
    PluginConfigError,
    PluginSpec,
    ProfileSpec,
    ReplicaSnapshot,
    RequestFeatures,
    Router,
)
from tests.routing.replicas import MODEL, replica

NAMES = ("a", "b", "c", "d")


def _pick(
    loads: list[int],
    totals: list[float],
    scraped: dict[str, tuple[float, float]] | None = None,
    **features: Any,
) -> tuple[str, str]:
    """(replica, branch) the picker chooses; `scraped` gives some replicas running, waiting."""
    reps = [replica(n, in_flight=x) for n, x in zip(NAMES, loads, strict=True)]
    for i, r in enumerate(reps):
        if scraped and r.name in scraped:
            running, waiting = scraped[r.name]
            reps[i] = dataclasses.replace(r, running=running, waiting=waiting)
    request = RequestFeatures(model=MODEL, block_hashes=(1, 2, 3, 4), **features)
    pick = PLUGINS["affinity_guard"].build({"seed": 0}).pick(request, reps, totals)
    return reps[pick.index].name, pick.branch


# Four replicas; with the default guard (1.5 x mean + 2) the limit is noted per row.
@pytest.mark.parametrize(
    ("loads", "totals", "features", "expected"),
    [
        # Tier 1 hit within the guard (mean 2, limit 5); the kind names the branch.
        ([5, 1, 2, 0], [0, 1, 0, 0], {"affinity_replica": "a"}, ("a", "prompt_cache_hit")),
        (
            [5, 1, 2, 0],
            [0, 1, 0, 0],
            {"affinity_replica": "a", "affinity_kind": "prompt_cache"},
            ("a", "prompt_cache_hit"),
        ),
        (
            [5, 1, 2, 0],
            [0, 1, 0, 0],
            {"affinity_replica": "a", "affinity_kind": "session"},
            ("a", "session"),
        ),
        # Affinity beats a longer prefix match elsewhere while its replica holds any of it.
        (
            [1, 1, 1, 1],
            [0, 1, 0, 0],
            {"affinity_replica": "a", "prefix_match": {"a": 1, "b": 4}},
            ("a", "prompt_cache_hit"),
        ),
        (
            [1, 1, 1, 1],
            [0, 1, 0, 0],
            {
                "affinity_replica": "a",
                "affinity_kind": "session",
                "inflight_match": {"a": 2},
                "prefix_match": {"b": 4},
            },
            ("a", "session"),
        ),
        # Out-held: a session whose replica holds none of the prompt while another holds some
        # (its entry outlived the cache it pointed at) goes to the holder.
        (
            [1, 1, 1, 1],
            [0, 1, 0, 0],
            {"affinity_replica": "a", "affinity_kind": "session", "prefix_match": {"b": 4}},
            ("b", "prefix_hit"),
        ),
        (
            [1, 1, 1, 1],
            [0, 1, 0, 0],
            {"affinity_replica": "a", "inflight_match": {"c": 3}},
            ("a", "prompt_cache_hit"),  # in flight elsewhere, nothing cached: no holder yet
        ),
    ],
)
def test_affinity_branches(
    loads: list[int], totals: list[float], features: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert _pick(loads, totals, **features) == expected


@pytest.mark.parametrize(
    ("loads", "totals", "features", "expected"),
    [
        ([0, 0, 0, 0], [1, 1, 0, 1], {"prefix_match": {"c": 1}}, ("c", "prefix_hit")),
        # Longest match first; equal matches: the least loaded holder.
        ([0, 0, 0, 0], [1, 1, 1, 1], {"prefix_match": {"b": 2, "c": 4}}, ("c", "prefix_hit")),
        ([0, 4, 1, 0], [1, 0, 0, 1], {"prefix_match": {"b": 3, "c": 3}}, ("c", "prefix_hit")),
        # Affinity replica over the guard (mean 4, limit 8): fall through to a holder.
        (
            [10, 0, 2, 4],
            [0, 1, 0, 0],
            {"affinity_replica": "a", "affinity_kind": "session", "prefix_match": {"c": 2}},
            ("c", "prefix_hit"),
        ),
        # Best holder over the guard (mean 4, limit 8), a shorter match within it.
        ([12, 0, 4, 0], [0, 1, 0, 1], {"prefix_match": {"a": 4, "c": 1}}, ("c", "prefix_hit")),
    ],
)
def test_prefix_hit_branch(
    loads: list[int], totals: list[float], features: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert _pick(loads, totals, **features) == expected


@pytest.mark.parametrize(
    ("loads", "totals", "features", "expected"),
    [
        # The only holder is over the guard (mean 5, limit 9.5): best total that passes.
        ([20, 0, 0, 0], [9, 1, 2, 0], {"prefix_match": {"a": 4}}, ("c", "load_guard")),
        # Holders and the affinity replica all over the guard (mean 9, limit 15.5).
        (
            [16, 16, 4, 0],
            [3, 3, 1, 2],
            {"affinity_replica": "b", "prefix_match": {"a": 4, "b": 4}},
            ("d", "load_guard"),
        ),
        # The load comes from vLLM when other clients fill the replica (mean 7.5, limit 13.25).
        (
            [0, 0, 0, 0],
            [5, 1, 0, 0],
            {"affinity_replica": "a", "scraped": {"a": (24.0, 6.0)}},
            ("b", "load_guard"),
        ),
    ],
)
def test_load_guard_branch(
    loads: list[int], totals: list[float], features: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert _pick(loads, totals, **features) == expected


@pytest.mark.parametrize(
    ("loads", "totals", "features", "expected"),
    [
        ([3, 0, 1, 2], [0.2, 1.0, 0.7, 0.4], {}, ("b", "miss_by_load")),
        # Affinity to a replica that is not a candidate (filtered out, or already tried).
        ([3, 0, 1, 2], [0.2, 1.0, 0.7, 0.4], {"affinity_replica": "zz"}, ("b", "miss_by_load")),
        # A match below min_match_blocks (1) does not make a holder.
        ([3, 0, 1, 2], [0.2, 1.0, 0.7, 0.4], {"prefix_match": {"a": 0}}, ("b", "miss_by_load")),
    ],
)
def test_miss_by_load_branch(
    loads: list[int], totals: list[float], features: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert _pick(loads, totals, **features) == expected


def test_min_match_blocks_param() -> None:
    reps = [replica("a"), replica("b")]
    features = RequestFeatures(model=MODEL, prefix_match={"a": 2})
    strict = PLUGINS["affinity_guard"].build({"min_match_blocks": 3, "seed": 0})
    assert strict.pick(features, reps, [0.0, 1.0]).branch == "miss_by_load"
    loose = PLUGINS["affinity_guard"].build({"min_match_blocks": 2, "seed": 0})
    assert loose.pick(features, reps, [0.0, 1.0]).branch == "prefix_hit"


def test_misses_on_an_idle_fleet_spread_instead_of_piling_up() -> None:
    reps = [replica(n) for n in NAMES]
    picker = PLUGINS["affinity_guard"].build({"seed": 3})
    request = RequestFeatures(model=MODEL)
    picks = [picker.pick(request, reps, [1.0] * 4) for _ in range(800)]
    assert {p.branch for p in picks} == {"miss_by_load"}
    counts = Counter(p.index for p in picks)
    assert set(counts) == {0, 1, 2, 3}
    assert all(150 <= c <= 250 for c in counts.values()), counts


def _send(router: Router, fleet: list[ReplicaSnapshot], request: RequestFeatures) -> str:
    """Route once and count the request on its replica, as the gateway does between scrapes."""
    decision = router.route(request, fleet)
    i = fleet.index(decision.replica)
    r = fleet[i]
    fleet[i] = dataclasses.replace(
        r,
        in_flight=r.in_flight + 1,
        queued_prefill_tokens=r.queued_prefill_tokens + request.prompt_tokens,
    )
    return decision.branch


def _burst(profile: ProfileSpec, count: int) -> tuple[list[str], list[int]]:
    """Branches of `count` identical requests whose prefix "a" holds, and the loads after."""
    # The last scrape saw an idle fleet; only the gateway's own counts move.
    fleet = [replica(n, running=0.0, waiting=0.0, kv_usage=0.1) for n in NAMES]
    router = Router(profile)
    request = RequestFeatures(
        model=MODEL, block_hashes=(1, 2, 3, 4), prefix_match={"a": 4}, prompt_tokens=900
    )
    params = dict(profile.picker.params)
    ratio = float(params.get("guard_ratio", 1.5))  # type: ignore[arg-type]
    slack = float(params.get("guard_slack", 2.0))  # type: ignore[arg-type]
    branches = []
    for _ in range(count):
        branches.append(_send(router, fleet, request))
        loads = [r.in_flight for r in fleet]
        # The holder never runs more than one request past the guard.
        assert loads[0] <= ratio * sum(loads) / len(loads) + slack + 1, branches
    return branches, [r.in_flight for r in fleet]


def test_a_burst_between_two_scrapes_spreads_once_the_guard_trips() -> None:
    plain = dataclasses.replace(
        BUILTIN_PROFILES["prefix"],
        picker=PluginSpec("affinity_guard"),  # 1.5 x mean + 2
    )
    branches, loads = _burst(plain, 40)
    # "a" takes the burst while its load a <= 1.5 * a / 4 + 2 (up to 4 in flight); the 5th
    # request trips the guard and goes by load, after which "a" gets about one in three.
    assert branches[:5] == ["prefix_hit"] * 4 + ["load_guard"]
    assert loads[0] == 17 and sorted(loads[1:]) == [7, 8, 8]
    assert Counter(branches) == {"prefix_hit": 17, "load_guard": 23}


def test_without_prefix_holders_only_the_affinity_replica_counts() -> None:
    reps = [replica("a"), replica("b", in_flight=1)]
    totals = [0.0, 1.0]

    def pick(params: dict[str, Any], **features: Any) -> tuple[str, str]:
        picker = PLUGINS["affinity_guard"].build({**params, "seed": 0})
        p = picker.pick(RequestFeatures(model=MODEL, **features), reps, totals)
        return reps[p.index].name, p.branch

    pure = {"prefix_holders": False}
    # "a" holds the whole prefix and is idle, yet the pick goes by the scores: a miss.
    assert pick(pure, prefix_match={"a": 4}) == ("b", "miss_by_load")
    # The affinity replica still sticks, whichever tier named it (the profile chose the tier).
    assert pick(pure, affinity_replica="a", affinity_kind="session") == ("a", "session")
    assert pick(pure, affinity_replica="a", affinity_kind="prompt_cache") == (
        "a",
        "prompt_cache_hit",
    )
    assert pick(pure, affinity_replica="a", affinity_kind="prefix_home") == ("a", "prefix_home")
    # By default the picker follows holders and homes.
    assert pick({}, prefix_match={"a": 4}) == ("a", "prefix_hit")
    assert pick({}, affinity_replica="a", affinity_kind="prefix_home") == ("a", "prefix_home")


def test_session_profile_ignores_prefix_homes_and_default_follows_them() -> None:
    fleet = [replica("a", in_flight=1), replica("b")]
    # A prefix home is tier 2 too: not in the session profile's affinity tiers.
    home = RequestFeatures(model=MODEL, block_hashes=(1, 2, 3, 4), prefix_home_replica="a")
    session = Router(BUILTIN_PROFILES["session"]).route(home, fleet)
    assert (session.replica.name, session.branch) == ("b", "miss_by_load")
    default = Router(BUILTIN_PROFILES["default"]).route(home, fleet)
    assert (default.replica.name, default.branch) == ("a", "prefix_home")
    # A session and a repeated prompt still stick in the session profile.
    for tier, branch in (("session", "session"), ("prompt_cache", "prompt_cache_hit")):
        request = dataclasses.replace(home, **{f"{tier}_replica": "a"})
        decision = Router(BUILTIN_PROFILES["session"]).route(request, fleet)
        assert (decision.replica.name, decision.branch) == ("a", branch)


def _without_joins(profile: ProfileSpec) -> ProfileSpec:
    """`profile` with no bound on new conversations (the load guard's own behaviour)."""
    params = {**profile.picker.params, "join_slack": None}
    return dataclasses.replace(profile, picker=dataclasses.replace(profile.picker, params=params))


def test_session_profile_ignores_prefix_holders_and_default_follows_them() -> None:
    _, loads = _burst(BUILTIN_PROFILES["session"], 8)
    assert max(loads) - min(loads) <= 1  # by load alone, although "a" holds the prefix
    branches, _ = _burst(_without_joins(BUILTIN_PROFILES["default"]), 8)
    assert branches == ["prefix_hit"] * 8


def test_default_copies_a_prefix_every_new_conversation_shares_at_low_concurrency() -> None:
    # Identical new conversations whose prefix only "a" holds, an idle fleet: "a" takes a
    # new conversation while it has at most join_slack (1) more than the fewest's; the
    # others go to the fewest picked, so "a" never runs more than 2 over the least loaded.
    fleet = [replica(n, running=0.0, waiting=0.0, kv_usage=0.1) for n in NAMES]
    router = Router(BUILTIN_PROFILES["default"])
    request = RequestFeatures(model=MODEL, block_hashes=(1, 2, 3, 4), prefix_match={"a": 4})
    branches = []
    for _ in range(12):
        branches.append(_send(router, fleet, request))
        loads = [r.in_flight for r in fleet]
        assert loads[0] == max(loads) and loads[0] - min(loads) <= 2, branches
    assert branches[:3] == ["prefix_hit", "prefix_hit", "share_guard"]
    assert branches.count("prefix_hit") == 4 and min(loads) >= 2


def test_join_slack_leaves_affinity_alone() -> None:
    # A conversation's later turns (session affinity) are not new: they stay where they run.
    fleet = [replica(n, running=0.0, waiting=0.0) for n in NAMES]
    router = Router(BUILTIN_PROFILES["default"])
    turn = RequestFeatures(model=MODEL, session="s", session_replica="a")
    assert [_send(router, fleet, turn) for _ in range(6)] == ["session"] * 6


@pytest.mark.parametrize("profile", ["prefix", "default"])
def test_builtin_profiles_guard_at_twice_the_mean_plus_8(profile: str) -> None:
    branches, loads = _burst(_without_joins(BUILTIN_PROFILES[profile]), 60)
    # a <= 2 * a / 4 + 8 holds up to a = 16: 17 hits, then the guard trips.
    assert branches[:18] == ["prefix_hit"] * 17 + ["load_guard"]
    assert loads[0] == max(loads) and min(loads) > 0


def _holder_pick(loads: list[int], blocks: int, share: float | None, capacity: int | None) -> str:
    """Branch of a request that "a" holds `blocks` blocks (16 tokens) of, at these loads."""
    reps = [
        replica(n, in_flight=x, cache_capacity_tokens=capacity)
        for n, x in zip(NAMES, loads, strict=True)
    ]
    params = {"guard_ratio": 2.0, "guard_slack": 8.0, "full_allowance_share": share, "seed": 0}
    picker = PLUGINS["affinity_guard"].build(params)
    request = RequestFeatures(model=MODEL, prefix_match={"a": blocks}, block_tokens=16)
    return picker.pick(request, reps, [0.0, 1.0, 1.0, 1.0]).branch


def test_a_short_match_earns_its_share_of_the_guard_allowance() -> None:
    # Loads a=3, b=0, c=1, d=0: mean 1, full guard 2 x 1 + 8 = 10, least load 0.
    # 4 blocks = 64 tokens of a 1,024-token cache fill 1/4 of the 0.25 share: allowance 2.5.
    assert _holder_pick([3, 0, 1, 0], 4, 0.25, 1024) == "load_guard"
    assert _holder_pick([2, 0, 1, 0], 4, 0.25, 1024) == "prefix_hit"
    # 16 blocks fill the whole share: the full guard of 10.
    assert _holder_pick([9, 0, 1, 0], 16, 0.25, 1024) == "prefix_hit"
    # No share, or a capacity never scraped: the full guard whatever the match.
    assert _holder_pick([9, 0, 1, 0], 4, None, 1024) == "prefix_hit"
    assert _holder_pick([9, 0, 1, 0], 4, 0.25, None) == "prefix_hit"


def _system_prompt_traffic(share: float | None, count: int) -> list[int]:
    """Requests sharing one short system prompt; every replica routed to becomes a holder."""
    fleet = [replica(n, cache_capacity_tokens=16384) for n in NAMES]
    guard = {"guard_ratio": 2.0, "guard_slack": 8.0, "full_allowance_share": share, "seed": 1}
    profile = dataclasses.replace(
        BUILTIN_PROFILES["default"], picker=PluginSpec("affinity_guard", params=guard)
    )
    router = Router(profile)
    holders: dict[str, int] = {}
    for _ in range(count):
        # 32 blocks: a 512-token system prompt, 1/32 of a replica's cache.
        request = RequestFeatures(
            model=MODEL,
            block_hashes=tuple(range(36)),
            prefix_match=dict(holders),
            prompt_tokens=600,
        )
        name = router.route(request, fleet).replica.name
        holders[name] = 32
        i = [r.name for r in fleet].index(name)
        fleet[i] = dataclasses.replace(fleet[i], in_flight=fleet[i].in_flight + 1)
    return [r.in_flight for r in fleet]


def test_a_short_shared_prefix_spreads_over_the_fleet_instead_of_piling_on_its_holder() -> None:
    # The whole allowance: the first holder takes every request up to 2 x mean + 8.
    assert sorted(_system_prompt_traffic(None, 12)) == [0, 0, 0, 12]
    # 1/32 of the cache against a share of 1/8: a quarter of the allowance above the least
    # load, so the prompt is copied to every replica and the load stays level.
    loads = _system_prompt_traffic(0.125, 40)
    assert max(loads) - min(loads) <= 3, loads


def test_a_holder_over_its_share_is_not_won_back_by_its_prefix_score() -> None:
    # "a" and "b" hold a 512-token system prompt and run 3 each; "c" and "d" idle. Within
    # the full guard (2 x 1.5 + 8) but over the share (1/4 of it above 0): the pick is "c" or
    # "d", although prefix_affinity scores the holders higher than the load scorers do.
    guard = {"guard_ratio": 2.0, "guard_slack": 8.0, "full_allowance_share": 0.125, "seed": 0}
    profile = dataclasses.replace(
        BUILTIN_PROFILES["default"], picker=PluginSpec("affinity_guard", params=guard)
    )
    fleet = [
        replica(n, in_flight=x, cache_capacity_tokens=16384)
        for n, x in zip(NAMES, [3, 3, 0, 0], strict=True)
    ]
    request = RequestFeatures(
        model=MODEL,
        block_hashes=tuple(range(36)),
        prefix_match={"a": 32, "b": 32},
        prompt_tokens=600,
    )
    decision = Router(profile).route(request, fleet)
    assert decision.scores["prefix_affinity"]["a"] > decision.scores["prefix_affinity"]["c"]
    assert (decision.replica.name, decision.branch) in {("c", "load_guard"), ("d", "load_guard")}


def test_holders_tied_on_match_and_load_go_by_score_then_at_random() -> None:
    reps = [replica(n) for n in NAMES]
    request = RequestFeatures(model=MODEL, prefix_match={"b": 4, "c": 4})
    picker = PLUGINS["affinity_guard"].build({"seed": 0})
    assert reps[picker.pick(request, reps, [0.0, 0.5, 0.9, 0.0]).index].name == "c"
    picks = Counter(picker.pick(request, reps, [0.0] * 4).index for _ in range(200))
    assert set(picks) == {1, 2} and min(picks.values()) > 60, picks


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"full_allowance_share": 0.0}, r"full_allowance_share in \(0, 1\]"),
        ({"full_allowance_share": 1.5}, r"full_allowance_share in \(0, 1\]"),
        ({"guard_ratio": 0.9}, "guard_ratio >= 1"),
        ({"guard_slack": -1}, "guard_slack >= 0"),
        ({"min_match_blocks": 0}, "min_match_blocks >= 1"),
        ({"share_window": -1}, "share_window >= 0"),
        ({"share_ratio": 0.5}, "share_ratio >= 1"),
        ({"share_slack": -2}, "share_slack >= 0"),
        ({"join_slack": -1.0}, "join_slack >= 0"),
        ({"yield_slack": -0.5}, "yield_slack >= 0"),
    ],
)
def test_affinity_guard_rejects_bad_params(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        PLUGINS["affinity_guard"].build(raw)


def _inflight_pick(blocks: int, indexed: int = 0, inflight: float | None = 0.5) -> str:
    """Who takes a prompt whose first `blocks` blocks a request in flight on "a" carries.

    `indexed`: how many of them the index already holds on "a". Loads a=1, others idle; a
    1,024-token cache and a full-allowance share of 1/4 (256 tokens = 16 blocks).
    """
    reps = [
        replica(n, in_flight=x, cache_capacity_tokens=1024)
        for n, x in zip(NAMES, [1, 0, 0, 0], strict=True)
    ]
    params = {"guard_ratio": 2.0, "guard_slack": 8.0, "full_allowance_share": 0.25, "seed": 0}
    picker = PLUGINS["affinity_guard"].build({**params, "inflight": inflight})
    request = RequestFeatures(
        model=MODEL,
        prefix_match={"a": indexed} if indexed else {},
        inflight_match={"a": blocks},
        block_tokens=16,
    )
    return reps[picker.pick(request, reps, [0.0, 1.0, 1.0, 1.0]).index].name


def test_a_long_prefix_in_flight_draws_the_next_request_and_a_short_one_does_not() -> None:
    # 16 blocks fill the share (w = 1), 8 half of it: inflight = 0.5.
    assert _inflight_pick(16) == "a"
    assert _inflight_pick(8) == "a"
    # 4 blocks (w = 1/4): cheap to copy, so the request goes by load, as a miss would.
    assert _inflight_pick(4) != "a"
    # A short prefix the index holds there is a holder as before (its allowance: 2.5).
    assert _inflight_pick(5, indexed=4) == "a"


def test_prefixes_in_flight_are_not_followed_by_default() -> None:
    # Off by default: with one common long system prompt, following it while it computes made
    # its first replica the only holder, and at low concurrency it then took every new user
    # (benchmarks/results/2026-12-03-inflight-prefixes/analysis.md).
    assert _inflight_pick(16, inflight=None) != "a"
    assert PLUGINS["affinity_guard"].build({})._p.inflight is None  # type: ignore[attr-defined]


def test_the_first_new_conversation_to_join_a_prefix_on_a_holder_is_never_copied_out() -> None:
    # Two users of one document stay together however many new conversations their replica
    # already took; the next users of that document are copied out while it is over.
    fleet = [replica(n, running=0.0, waiting=0.0) for n in NAMES]
    router = Router(BUILTIN_PROFILES["default"])
    common = RequestFeatures(model=MODEL, block_hashes=(1, 2, 3, 4), prefix_match={"a": 4})
    assert [_send(router, fleet, common) for _ in range(3)][-1] == "share_guard"
    document = RequestFeatures(model=MODEL, block_hashes=(5, 6, 7, 8), prefix_match={"a": 4})
    assert _send(router, fleet, document) == "prefix_hit"  # a: 3 new, the fewest 0
    assert fleet[0].in_flight == 3
    assert _send(router, fleet, document) == "share_guard"


def test_without_prefix_holders_an_out_held_session_still_sticks() -> None:
    # The `session` profile's picker follows no holders: its sessions stay where they were.
    reps = [replica(n, in_flight=1) for n in NAMES]
    request = RequestFeatures(
        model=MODEL,
        block_hashes=(1, 2, 3, 4),
        affinity_replica="a",
        affinity_kind="session",
        prefix_match={"b": 4},
    )
    picker = PLUGINS["affinity_guard"].build({"seed": 0, "prefix_holders": False})
    pick = picker.pick(request, reps, [0.0, 1.0, 0.0, 0.0])
    assert (reps[pick.index].name, pick.branch) == ("a", "session")


def _yield_pick(loads: list[int], match: dict[str, int], slack: float | None = 1.0) -> str:
    """Where a session pinned to "a" goes when `match` gives each replica's cached blocks."""
    reps = [replica(n, in_flight=x) for n, x in zip(NAMES, loads, strict=True)]
    request = RequestFeatures(
        model=MODEL,
        block_hashes=(1, 2, 3, 4),
        affinity_replica="a",
        affinity_kind="session",
        prefix_match=match,
    )
    params = {"guard_ratio": 2.0, "guard_slack": 8.0, "seed": 0, "yield_slack": slack}
    pick = PLUGINS["affinity_guard"].build(params).pick(request, reps, [0.0] * 4)
    return f"{reps[pick.index].name} {pick.branch}"


def test_a_session_yields_to_an_equal_holder_lighter_by_more_than_the_slack() -> None:
    # The system prompt alone is shared (4 blocks on a and b): b is 2 requests lighter.
    assert _yield_pick([3, 1, 0, 0], {"a": 4, "b": 4}) == "b prefix_hit"
    # Lighter by the slack or less: the session stays, as it does with the rule off.
    assert _yield_pick([2, 1, 0, 0], {"a": 4, "b": 4}) == "a session"
    assert _yield_pick([3, 1, 0, 0], {"a": 4, "b": 4}, slack=None) == "a session"
    # The session's replica holds more (its own history): no other holder undercuts it.
    assert _yield_pick([6, 0, 0, 0], {"a": 4, "b": 3}) == "a session"
    # Idle replicas holding nothing never draw the session away.
    assert _yield_pick([6, 0, 0, 0], {"a": 4}) == "a session"
