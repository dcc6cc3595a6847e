from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from routing import (
    BUILTIN_PROFILES,
    PLUGINS,
    NoReplicaError,
    Pick,
    PluginFactory,
    PluginSpec,
    ProfileSpec,
    ReplicaSnapshot,
    RequestFeatures,
    Router,
    RoutingError,
    Saturated,
    param,
)
from routing.plugin import AnyFactory
from tests.routing.replicas import MODEL, REQUEST, replica


@dataclass(frozen=True, slots=True)
class _LabelParams:
    """Which label holds the score."""

    label: str = param("score", "label to read")


class _LabelScorer:
    """Scores each replica with float(labels[label]), out-of-range values included."""

    def __init__(self, params: _LabelParams) -> None:
        self._label = params.label

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        return [float(r.labels[self._label]) for r in replicas]


class _ShortScorer:
    """A broken scorer: one score too few."""

    def __init__(self, params: _LabelParams) -> None:
        del params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        return [1.0] * (len(replicas) - 1)


class _LastPicker:
    """A broken picker: one past the end."""

    def __init__(self, params: _LabelParams) -> None:
        del params

    def pick(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot], totals: Sequence[float]
    ) -> Pick:
        return Pick(len(replicas), "past_end")


_EXTRA: dict[str, AnyFactory] = {
    "label_a": PluginFactory("t.label_a", "A.", "scorer", _LabelParams, _LabelScorer),
    "label_b": PluginFactory("t.label_b", "B.", "scorer", _LabelParams, _LabelScorer),
    "short": PluginFactory("t.short", "S.", "scorer", _LabelParams, _ShortScorer),
    "past_end": PluginFactory("t.past_end", "P.", "picker", _LabelParams, _LastPicker),
}
TEST_PLUGINS = MappingProxyType({**PLUGINS, **_EXTRA})


def _router(
    scorers: tuple[PluginSpec, ...] = (), picker: str = "max_score", **picker_params: object
) -> Router:
    filters = (PluginSpec("healthy"), PluginSpec("serves_model"))
    profile = ProfileSpec(PluginSpec(picker, params=picker_params), filters, scorers, name="t")
    return Router(profile, TEST_PLUGINS)


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [
        ("0.5", 0.5),
        ("0", 0.0),
        ("1", 1.0),
        ("1.7", 1.0),
        ("-0.3", 0.0),
        ("inf", 1.0),
        ("-inf", 0.0),
        ("nan", 0.0),
    ],
)
def test_scores_are_clamped_and_nan_is_zero(raw: str, clamped: float) -> None:
    reps = [replica("x", labels={"score": raw}), replica("y", labels={"score": "0.25"})]
    decision = _router((PluginSpec("label_a", 2.0),), seed=0).route(REQUEST, reps)
    assert decision.scores["label_a"] == {"x": clamped, "y": 0.25}
    assert decision.replica.name == ("x" if clamped > 0.25 else "y")
    assert decision.total == 2.0 * max(clamped, 0.25)
    assert not math.isnan(decision.total)


@pytest.mark.parametrize("at", [0, 1, 2])
def test_a_nan_anywhere_among_in_range_scores_is_zero(at: int) -> None:
    # min() and max() skip a NaN after the first element: the in-range check must not.
    raws = ["0.25", "0.5", "0.75"]
    raws[at] = "nan"
    reps = [replica(f"r{i}", labels={"score": raw}) for i, raw in enumerate(raws)]
    decision = _router((PluginSpec("label_a", 1.0),), seed=0).route(REQUEST, reps)
    expect = {f"r{i}": 0.0 if i == at else float(raw) for i, raw in enumerate(raws)}
    assert decision.scores["label_a"] == expect
    assert not math.isnan(decision.total) and decision.total == max(expect.values())


def test_totals_are_weighted_sums_and_scores_stay_unweighted() -> None:
    reps = [
        replica("a", labels={"a": "1.0", "b": "0.0"}),
        replica("b", labels={"a": "0.0", "b": "1.0"}),
        replica("c", labels={"a": "0.5", "b": "0.5"}),
    ]
    scorers = (
        PluginSpec("label_a", 1.0, {"label": "a"}),
        PluginSpec("label_b", 3.0, {"label": "b"}),
    )
    decision = _router(scorers, seed=0).route(REQUEST, reps)
    assert decision.replica.name == "b"
    assert (decision.branch, decision.total, decision.candidates) == ("max_score", 3.0, 3)
    assert decision.scores == {
        "label_a": {"a": 1.0, "b": 0.0, "c": 0.5},
        "label_b": {"a": 0.0, "b": 1.0, "c": 0.5},
    }


@pytest.mark.parametrize(
    ("fleet", "exclude", "reason"),
    [
        ([], (), "no replicas configured"),
        ([replica("a"), replica("b")], ("a", "b"), "every replica was already tried"),
        ([replica("a", healthy=False)], (), "filter 'healthy' removed every replica"),
        ([replica("a", models=("qwen",))], (), "filter 'serves_model' removed every replica"),
        (
            [replica("a", models=("qwen",)), replica("b", healthy=False)],
            ("c",),
            "filter 'serves_model' removed every replica",
        ),
        ([replica("a"), replica("b", healthy=False)], {"a"}, "filter 'healthy' removed"),
    ],
)
def test_no_replica_names_the_reason(
    fleet: list[ReplicaSnapshot], exclude: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(NoReplicaError, match=reason) as info:
        Router(BUILTIN_PROFILES["default"]).route(REQUEST, fleet, exclude)
    assert info.value.model == MODEL
    assert not isinstance(info.value, Saturated)  # nothing to wait for: fail at once


def test_exclude_never_returns_a_replica_already_tried() -> None:
    fleet = [replica(n) for n in "abcd"]
    router = Router(BUILTIN_PROFILES["random"])
    tried: list[str] = []
    for _ in range(4):
        decision = router.route(REQUEST, fleet, tried)
        assert decision.replica.name not in tried
        assert decision.candidates == 4 - len(tried)
        tried.append(decision.replica.name)
    assert sorted(tried) == ["a", "b", "c", "d"]


def test_least_load_sends_to_the_least_loaded_candidate() -> None:
    fleet = [
        replica("busy", in_flight=9),
        replica("idle-but-down", in_flight=0, healthy=False),
        replica("light", in_flight=2),
        replica("wrong-model", in_flight=0, models=("qwen",)),
    ]
    decision = Router(BUILTIN_PROFILES["least_load"]).route(REQUEST, fleet)
    assert (decision.replica.name, decision.branch, decision.candidates) == (
        "light",
        "max_score",
        2,
    )
    assert decision.scores == {"least_inflight": {"busy": 0.125, "light": 1.0}}


def test_default_profile_places_a_miss_by_load_and_a_hit_on_its_holder() -> None:
    router = Router(BUILTIN_PROFILES["default"])
    fleet = [replica("busy", in_flight=3), replica("idle"), replica("warm", in_flight=1)]
    miss = router.route(REQUEST, fleet)
    assert (miss.replica.name, miss.branch) == ("idle", "miss_by_load")
    hit = RequestFeatures(model=MODEL, block_hashes=(1, 2, 3, 4), prefix_match={"warm": 3})
    decision = router.route(hit, fleet)
    assert (decision.replica.name, decision.branch) == ("warm", "prefix_hit")
    assert decision.scores["prefix_affinity"] == {"busy": 0.0, "idle": 0.0, "warm": 0.75}


def test_default_profile_without_cache_data_is_load_balancing() -> None:
    router = Router(BUILTIN_PROFILES["default"])
    fleet = [replica(n, in_flight=x) for n, x in (("a", 6), ("b", 0), ("c", 9))]
    decisions = [router.route(REQUEST, fleet) for _ in range(5)]
    assert {(d.replica.name, d.branch) for d in decisions} == {("b", "miss_by_load")}
    # Within 4 requests of the least load (share_band), new prefixes go by how many each
    # replica started: b took the last 5, so a, 2 more in flight, takes the next.
    near = [replica(n, in_flight=x) for n, x in (("a", 2), ("b", 0), ("c", 9))]
    assert router.route(REQUEST, near).replica.name == "a"


def test_round_robin_profile_rotates_without_scores() -> None:
    router = Router(BUILTIN_PROFILES["round_robin"])
    fleet = [replica(n) for n in "abc"]
    decisions = [router.route(REQUEST, fleet) for _ in range(6)]
    assert [d.replica.name for d in decisions] == list("abcabc")
    assert all(d.scores == {} and d.total == 0.0 and d.branch == "round_robin" for d in decisions)


def test_broken_scorer_and_picker_are_reported() -> None:
    fleet = [replica(n, labels={"score": "1"}) for n in "ab"]
    with pytest.raises(RoutingError, match="scorer 'short' returned 1 scores for 2 replicas"):
        _router((PluginSpec("short"),)).route(REQUEST, fleet)
    with pytest.raises(RoutingError, match="picker chose index 2 of 2 candidates"):
        _router((), "past_end").route(REQUEST, fleet)


def test_each_router_owns_its_plugin_state() -> None:
    fleet = [replica(n) for n in "ab"]
    first, second = (Router(BUILTIN_PROFILES["round_robin"]) for _ in range(2))
    assert first.route(REQUEST, fleet).replica.name == "a"
    assert first.route(REQUEST, fleet).replica.name == "b"
    assert second.route(REQUEST, fleet).replica.name == "a"


def test_default_profile_sends_a_miss_past_a_lighter_replica_still_prefilling() -> None:
    # Enough in flight that the load guard binds (no share-window placement): totals decide.
    # "prefilling" has 6 fewer requests in flight but a 520-token prompt not yet answered;
    # the miss waits behind that prefill there, behind nothing on "decoding".
    fleet = [
        replica("decoding", in_flight=12),
        replica("prefilling", in_flight=6, queued_prefill_tokens=520),
        replica("busiest", in_flight=16),
    ]
    decision = Router(BUILTIN_PROFILES["default"]).route(REQUEST, fleet)
    assert (decision.replica.name, decision.branch) == ("decoding", "miss_by_load")
