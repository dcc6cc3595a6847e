"""The model_version filter: a request keeps to its version's replicas; none asked, all pass."""

from __future__ import annotations

from dataclasses import replace

import pytest

from routing import PLUGINS, NoReplicaError, RequestFeatures, Router
from routing.profile import BUILTIN_PROFILES
from tests.routing.replicas import MODEL, names, replica

FLEET = [
    replica("v1-a", labels={"version": "v1", "zone": "a"}),
    replica("v1-b", labels={"version": "v1", "zone": "b"}),
    replica("v2-a", labels={"version": "v2", "zone": "a"}),
    replica("bare"),
]


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        ({}, names(FLEET)),
        ({"version": "v1"}, ["v1-a", "v1-b"]),
        ({"version": "v2", "zone": "a"}, ["v2-a"]),
        ({"version": "v3"}, []),
    ],
)
def test_model_version_filter(wanted: dict[str, str], expected: list[str]) -> None:
    plugin = PLUGINS["model_version"].build({})
    request = RequestFeatures(model=MODEL, version_labels=wanted)
    assert names(plugin.filter(request, FLEET)) == expected


@pytest.mark.parametrize("profile", sorted(BUILTIN_PROFILES))
def test_every_builtin_profile_keeps_to_the_version(profile: str) -> None:
    router = Router(BUILTIN_PROFILES[profile])
    for i in range(10):
        req = RequestFeatures(model=MODEL, request_id=str(i), version_labels={"version": "v1"})
        assert router.route(req, FLEET).replica.name in ("v1-a", "v1-b")
    with pytest.raises(NoReplicaError, match="model_version"):
        router.route(replace(req, version_labels={"version": "v9"}), FLEET)


def test_cache_affinity_does_not_leave_the_version() -> None:
    router = Router(BUILTIN_PROFILES["default"])
    # The prompt was last served (and its prefix held) by v2-a; the request is on v1.
    req = RequestFeatures(
        model=MODEL,
        prompt_cache_replica="v2-a",
        block_hashes=(1, 2, 3),
        prefix_match={"v2-a": 3},
        version_labels={"version": "v1"},
    )
    assert router.route(req, FLEET).replica.name in ("v1-a", "v1-b")
    assert router.route(replace(req, version_labels={}), FLEET).replica.name == "v2-a"


def test_without_versions_the_filter_changes_no_decision() -> None:
    default = BUILTIN_PROFILES["default"]
    picker = replace(default.picker, params={**default.picker.params, "seed": 3})
    seeded = replace(default, picker=picker)
    before = replace(seeded, filters=tuple(f for f in seeded.filters if f.type != "model_version"))
    assert len(before.filters) == len(seeded.filters) - 1
    old, new = Router(before), Router(seeded)
    fleet = [replica(f"r{i}", in_flight=i % 3, labels={"version": f"v{i % 2}"}) for i in range(4)]
    for i in range(60):
        req = RequestFeatures(
            model=MODEL, request_id=str(i), block_hashes=(i % 7,), prefix_match={"r1": i % 4}
        )
        assert old.route(req, fleet).replica.name == new.route(req, fleet).replica.name
