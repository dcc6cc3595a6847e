from __future__ import annotations

from typing import Any

import pytest

from routing import (
    PLUGINS,
    NoReplicaError,
    PluginConfigError,
    PluginSpec,
    ProfileSpec,
    Router,
    Saturated,
)
from tests.routing.replicas import REQUEST, names, replica

FLEET = [
    replica("idle", in_flight=0, running=0.0, waiting=0.0, kv_usage=0.1),
    replica("queued", in_flight=20, running=8.0, waiting=16.0, kv_usage=0.5),
    replica("kv-full", in_flight=4, running=4.0, waiting=0.0, kv_usage=0.95),
    replica("busy", in_flight=12, running=64.0, waiting=2.0, kv_usage=0.6),
    replica("unscraped", in_flight=3),
]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, ["idle", "busy", "unscraped"]),
        ({"max_running": 64}, ["idle", "unscraped"]),
        ({"max_in_flight": 12}, ["idle", "unscraped"]),
        ({"max_in_flight": 4, "max_kv_usage": None}, ["idle", "unscraped"]),
        ({"max_in_flight": 5, "max_kv_usage": None}, ["idle", "kv-full", "unscraped"]),
        ({"max_in_flight": 3}, ["idle"]),
        ({"max_waiting": None, "max_kv_usage": None}, names(FLEET)),
        ({"max_waiting": 17}, ["idle", "queued", "busy", "unscraped"]),
        ({"max_kv_usage": 0.5, "max_waiting": None}, ["idle", "unscraped"]),
    ],
)
def test_saturation_drops_replicas_at_a_limit(params: dict[str, Any], expected: list[str]) -> None:
    plugin = PLUGINS["saturation"].build(params)
    assert names(plugin.filter(REQUEST, FLEET)) == expected


def test_saturation_passes_the_set_through_when_nothing_is_full() -> None:
    fleet = FLEET[:1]
    assert PLUGINS["saturation"].build({}).filter(REQUEST, fleet) is fleet


def test_everything_saturated_is_no_replica_for_the_gateway_to_queue() -> None:
    profile = ProfileSpec(
        PluginSpec("max_score"),
        (PluginSpec("healthy"), PluginSpec("saturation", params={"max_in_flight": 2})),
        (PluginSpec("least_inflight"),),
        name="t",
    )
    router = Router(profile)
    assert router.route(REQUEST, [replica("a", in_flight=1)]).replica.name == "a"
    # Saturated (a NoReplicaError) tells the gateway to queue the request.
    with pytest.raises(Saturated, match="filter 'saturation' removed every replica"):
        router.route(REQUEST, [replica("a", in_flight=2), replica("b", in_flight=5)])
    # A replica the saturation filter never saw (unhealthy, removed before it) is no reason
    # to wait: the request fails at once.
    with pytest.raises(NoReplicaError, match="filter 'healthy'") as info:
        router.route(REQUEST, [replica("a", healthy=False)])
    assert not isinstance(info.value, Saturated)


@pytest.mark.parametrize("raw", [{"max_waiting": 0}, {"max_kv_usage": -0.1}, {"max_running": 0}])
def test_saturation_rejects_non_positive_limits(raw: dict[str, Any]) -> None:
    with pytest.raises(PluginConfigError, match="must be > 0 or None"):
        PLUGINS["saturation"].build(raw)


@pytest.mark.parametrize("params", [{"max_kv_usage": None}, {}])
def test_a_nan_reading_is_at_its_limit_with_one_limit_or_several(params: dict[str, Any]) -> None:
    # One configured limit is checked inline, several in a loop: both drop a NaN reading.
    odd = replica("nan", in_flight=0, running=0.0, waiting=float("nan"), kv_usage=0.1)
    plugin = PLUGINS["saturation"].build(params)
    assert names(plugin.filter(REQUEST, [odd, FLEET[0]])) == ["idle"]
