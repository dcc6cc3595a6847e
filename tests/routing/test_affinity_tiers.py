"""A profile's `affinity` orders the cache tiers: the Router follows the first with a candidate."""

from __future__ import annotations

from typing import Any

import pytest

from routing import Branch, PluginSpec, ProfileSpec, RequestFeatures, Router
from routing.types import Tier
from tests.routing.replicas import MODEL, replica

# Every replica idle and within the guard: only the affinity decides, else a miss by load.
FLEET = [replica(n) for n in ("p", "s", "h", "x")]
# Each tier names its own replica.
TIERS = {"prompt_cache_replica": "p", "session_replica": "s", "prefix_home_replica": "h"}


def _route(affinity: tuple[Tier, ...] | None, **features: Any) -> tuple[str, str]:
    """(replica, branch) of one request under an affinity_guard profile with this tier order."""
    filters = (PluginSpec("healthy"), PluginSpec("serves_model"))
    picker = PluginSpec("affinity_guard", params={"seed": 0})
    order = {} if affinity is None else {"affinity": affinity}
    spec = ProfileSpec(picker, filters, name="t", **order)  # type: ignore[arg-type]
    decision = Router(spec).route(RequestFeatures(model=MODEL, **features), FLEET)
    return decision.replica.name, decision.branch


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        (None, ("p", "prompt_cache_hit")),  # the default: prompt cache, session, prefix home
        (("session", "prompt_cache", "prefix_home"), ("s", "session")),
        (("session",), ("s", "session")),
        (("prefix_home", "session"), ("h", "prefix_home")),
    ],
)
def test_the_first_tier_of_the_profile_wins(
    affinity: tuple[Tier, ...] | None, expected: tuple[str, str]
) -> None:
    assert _route(affinity, **TIERS) == expected


def test_a_tier_without_a_candidate_hands_over_to_the_next() -> None:
    session_first: tuple[Tier, ...] = ("session", "prompt_cache", "prefix_home")
    assert _route(session_first, prompt_cache_replica="p", prefix_home_replica="h") == (
        "p",
        "prompt_cache_hit",
    )
    assert _route(session_first, prefix_home_replica="h") == ("h", "prefix_home")
    assert _route(None, session_replica="s", prefix_home_replica="h") == ("s", "session")


def test_tiers_left_out_of_the_profile_are_not_followed() -> None:
    branch = _route((), **TIERS)[1]
    assert branch == Branch.MISS_BY_LOAD
    assert _route(("prompt_cache", "session"), prefix_home_replica="h")[1] == "miss_by_load"


def test_an_affinity_replica_set_by_the_caller_is_kept() -> None:
    preset = {"affinity_replica": "x", "affinity_kind": "session"}
    assert _route(None, **TIERS, **preset) == ("x", "session")


def test_a_filtered_out_tier_replica_does_not_hand_over_to_the_next_tier() -> None:
    # The prompt-cache replica is down: the request goes on to the picker's later steps (no
    # holder here: a miss by load), never to the session replica.
    fleet = [replica("p", healthy=False), replica("s", in_flight=1), replica("x")]
    spec = ProfileSpec(PluginSpec("affinity_guard", params={"seed": 0}), (PluginSpec("healthy"),))
    request = RequestFeatures(model=MODEL, prompt_cache_replica="p", session_replica="s")
    decision = Router(spec).route(request, fleet)
    assert (decision.replica.name, decision.branch) == ("x", "miss_by_load")


def test_branches_are_the_enum_and_compare_as_their_label() -> None:
    _, branch = _route(None, **TIERS)
    assert isinstance(branch, Branch) and branch is Branch.PROMPT_CACHE_HIT
    assert f"{branch}" == str(branch) == "prompt_cache_hit" == branch
