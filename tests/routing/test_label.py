from __future__ import annotations

from typing import Any

import pytest

from routing import PLUGINS, NoReplicaError, PluginConfigError, RequestFeatures, Router
from routing.profile import PluginSpec, ProfileSpec
from tests.routing.replicas import MODEL, names, replica

FLEET = [
    replica("fp16-a", labels={"precision": "fp16", "arch": "h100"}),
    replica("int4-a", labels={"precision": "int4", "arch": "h100"}),
    replica("int4-b", labels={"precision": "int4", "arch": "a100"}),
    replica("bare"),
]


@pytest.mark.parametrize(
    ("params", "hints", "expected"),
    [
        ({}, {}, names(FLEET)),
        ({"key": "precision", "value": "int4"}, {}, ["int4-a", "int4-b"]),
        ({}, {"precision": "int4"}, ["int4-a", "int4-b"]),
        ({}, {"precision": "int4", "arch": "a100"}, ["int4-b"]),
        ({"key": "arch", "value": "h100"}, {"precision": "int4"}, ["int4-a"]),
        # A hint nothing matches is a preference: everyone stays...
        ({}, {"precision": "fp8"}, names(FLEET)),
        ({"key": "arch", "value": "h100"}, {"arch": "a100"}, ["fp16-a", "int4-a"]),
        # ...unless hints are required, or ignored altogether.
        ({"hints_required": True}, {"precision": "fp8"}, []),
        ({"use_hints": False}, {"precision": "int4"}, names(FLEET)),
        ({"key": "precision", "value": "bf16"}, {}, []),
    ],
)
def test_label_filter(params: dict[str, Any], hints: dict[str, str], expected: list[str]) -> None:
    plugin = PLUGINS["label"].build(params)
    request = RequestFeatures(model=MODEL, hints=hints)
    assert names(plugin.filter(request, FLEET)) == expected


def test_label_filter_that_matches_nothing_means_no_replica() -> None:
    filters = (PluginSpec("label", params={"key": "precision", "value": "bf16"}),)
    router = Router(ProfileSpec(PluginSpec("round_robin"), filters, name="t"))
    with pytest.raises(NoReplicaError, match="filter 'label' removed every replica"):
        router.route(RequestFeatures(model=MODEL), FLEET)


def test_label_value_needs_a_key() -> None:
    with pytest.raises(PluginConfigError, match="value needs a key"):
        PLUGINS["label"].build({"value": "int4"})
