"""route() with one candidate left takes its own path: the same decision as the list path."""

from __future__ import annotations

import math

import pytest

from routing import BUILTIN_PROFILES, PluginSpec, Router, RoutingError
from tests.routing.replicas import REQUEST, replica
from tests.routing.test_router import _router


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [("0.5", 0.5), ("1.7", 1.0), ("-0.3", 0.0), ("inf", 1.0), ("-inf", 0.0), ("nan", 0.0)],
)
def test_one_candidate_scores_are_clamped_and_summed_in_order(raw: str, clamped: float) -> None:
    scorers = (
        PluginSpec("label_a", 2.0, {"label": "a"}),
        PluginSpec("label_b", 0.5, {"label": "b"}),
    )
    # Two replicas, one filtered out (unhealthy): one candidate reaches the scorers.
    reps = [
        replica("x", labels={"a": raw, "b": "0.3"}),
        replica("y", healthy=False, labels={"a": "1", "b": "1"}),
    ]
    decision = _router(scorers, seed=0).route(REQUEST, reps)
    assert decision.replica.name == "x" and decision.candidates == 1
    assert decision.scores == {"label_a": {"x": clamped}, "label_b": {"x": 0.3}}
    # The list path's sum: 0.0 + w1 * s1, then + w2 * s2, in the profile's order.
    assert decision.total == (0.0 + 2.0 * clamped) + 0.5 * 0.3
    assert not math.isnan(decision.total)


def test_one_candidate_default_profile_matches_a_fleet_of_equal_replicas() -> None:
    # Equal replicas score equally: each candidate's scores and total are the lone replica's.
    router = Router(BUILTIN_PROFILES["default"])
    one = router.route(REQUEST, [replica("a", in_flight=1)])
    many = router.route(REQUEST, [replica(n, in_flight=1) for n in "abc"])
    assert one.candidates == 1 and many.candidates == 3
    assert one.total == many.total and one.branch == many.branch
    assert {k: v["a"] for k, v in one.scores.items()} == {
        k: v[many.replica.name] for k, v in many.scores.items()
    }


def test_one_candidate_broken_scorer_and_picker_are_reported() -> None:
    fleet = [replica("a", labels={"score": "1"})]
    with pytest.raises(RoutingError, match="scorer 'short' returned 0 scores for 1 replicas"):
        _router((PluginSpec("short"),)).route(REQUEST, fleet)
    with pytest.raises(RoutingError, match="picker chose index 1 of 1 candidates"):
        _router((), "past_end").route(REQUEST, fleet)
