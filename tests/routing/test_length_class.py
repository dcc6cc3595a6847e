"""The length_class filter: long prompts to their instance class, a fallback when it is empty."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from routing import PLUGINS, NoReplicaError, PluginConfigError, RequestFeatures, Router
from routing.plugins.length_class import Params, in_class
from routing.profile import BUILTIN_PROFILES, PluginSpec, ProfileSpec
from tests.routing.replicas import MODEL, names, replica

LONG_CTX = {"class": "long-context"}
FLEET = [
    replica("short-a"),
    replica("long-a", labels=LONG_CTX),
    replica("short-b", labels={"class": "standard"}),
    replica("long-b", labels=LONG_CTX),
]
SHORTS = [r for r in FLEET if r.labels.get("class") != "long-context"]
LONG = RequestFeatures(model=MODEL, prompt_tokens=9000)
SHORT = RequestFeatures(model=MODEL, prompt_tokens=100)


@pytest.mark.parametrize(
    ("params", "request_", "fleet", "expected"),
    [
        ({}, LONG, FLEET, ["long-a", "long-b"]),
        ({}, SHORT, FLEET, ["short-a", "short-b"]),
        ({"short_avoids_class": False}, SHORT, FLEET, names(FLEET)),
        # The threshold is exclusive: exactly min_prompt_tokens is short.
        ({"min_prompt_tokens": 9000}, LONG, FLEET, ["short-a", "short-b"]),
        ({"min_prompt_tokens": 8999}, LONG, FLEET, ["long-a", "long-b"]),
        ({"key": "class", "value": "standard"}, LONG, FLEET, ["short-b"]),
        # An empty side falls back to every candidate...
        ({}, LONG, SHORTS, names(SHORTS)),
        ({}, SHORT, FLEET[1::2], ["long-a", "long-b"]),
        # ...unless the class is required (a short prompt never is refused).
        ({"required": True}, LONG, SHORTS, []),
        ({"required": True}, SHORT, FLEET[1::2], ["long-a", "long-b"]),
    ],
)
def test_length_class_filter(
    params: dict[str, Any], request_: RequestFeatures, fleet: list[Any], expected: list[str]
) -> None:
    plugin = PLUGINS["length_class"].build(params)
    assert names(plugin.filter(request_, fleet)) == expected


def test_in_class_tells_a_fallback_from_a_class_pick() -> None:
    p = Params()
    assert in_class(p, LONG, FLEET[1]) and not in_class(p, LONG, FLEET[0])
    assert in_class(p, SHORT, FLEET[0]) and not in_class(p, SHORT, FLEET[1])
    assert in_class(Params(short_avoids_class=False), SHORT, FLEET[1])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"min_prompt_tokens": -1}, "min_prompt_tokens must be >= 0"),
        ({"key": ""}, "key and value must be non-empty"),
        ({"value": ""}, "key and value must be non-empty"),
        ({"min_prompt_tokens": "long"}, "must be int"),
    ],
)
def test_bad_params_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        PLUGINS["length_class"].parse(params)


def _seeded() -> ProfileSpec:
    # The default profile with its tie-break generator seeded: two routers decide alike.
    default = BUILTIN_PROFILES["default"]
    picker = replace(default.picker, params={**default.picker.params, "seed": 7})
    return replace(default, picker=picker)


def _with_class(**params: Any) -> Router:
    default = _seeded()
    filters = (*default.filters, PluginSpec("length_class", params=params))
    return Router(replace(default, filters=filters, name="classes"))


def test_in_a_profile_a_long_prompt_reaches_the_class_and_a_short_one_does_not() -> None:
    router = _with_class()
    for i in range(20):
        long = replace(LONG, request_id=f"l{i}", session=f"s{i}")
        assert router.route(long, FLEET).replica.labels == LONG_CTX
        short = replace(SHORT, request_id=f"s{i}", session=f"s{i}")
        assert router.route(short, FLEET).replica.labels != LONG_CTX


def test_required_class_empty_means_no_replica() -> None:
    with pytest.raises(NoReplicaError, match="length_class"):
        _with_class(required=True).route(LONG, SHORTS)


def test_without_class_labels_the_filter_changes_no_decision() -> None:
    # Left out of the default profile all the same: there a long prompt would be a fallback.
    plain = [replica(f"r{i}", in_flight=i % 3, cached_blocks=i) for i in range(4)]
    base, classes = Router(_seeded()), _with_class()
    for i in range(40):
        req = replace(LONG if i % 2 else SHORT, request_id=str(i), prefix_match={"r2": i % 5})
        assert base.route(req, plain).replica.name == classes.route(req, plain).replica.name
