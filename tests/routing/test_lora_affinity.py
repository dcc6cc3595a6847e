from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError, ReplicaSnapshot, RequestFeatures
from tests.routing.replicas import MODEL, names, replica

SQL = "llama-sql"


def _fleet(loads: dict[str, int], holders: set[str]) -> list[ReplicaSnapshot]:
    return [
        replica(
            n,
            models=(MODEL, SQL),
            in_flight=x,
            loaded_adapters=frozenset({SQL} if n in holders else ()),
        )
        for n, x in loads.items()
    ]


@pytest.mark.parametrize(
    ("model", "loads", "holders", "margin", "expected"),
    [
        # Holders kept, loaded or not.
        (SQL, {"a": 0, "b": 3, "c": 0}, {"b"}, 4, ["b"]),
        (SQL, {"a": 0, "b": 3, "c": 9}, {"b", "c"}, 4, ["b", "c"]),
        # b is 4 over the idlest non-holder: still within the margin.
        (SQL, {"a": 1, "b": 5}, {"b"}, 4, ["b"]),
        # Every holder past the margin: everyone stays, the load scorers decide.
        (SQL, {"a": 1, "b": 6}, {"b"}, 4, ["a", "b"]),
        (SQL, {"a": 1, "b": 6, "c": 9}, {"b", "c"}, 4, ["a", "b", "c"]),
        (SQL, {"a": 1, "b": 6, "c": 2}, {"b", "c"}, 4, ["b", "c"]),
        (SQL, {"a": 0, "b": 1}, {"b"}, 0, ["a", "b"]),
        # Nobody has it loaded, everybody has it, or a base-model request: pass-through.
        (SQL, {"a": 0, "b": 0}, set(), 4, ["a", "b"]),
        (SQL, {"a": 0, "b": 7}, {"a", "b"}, 4, ["a", "b"]),
        (MODEL, {"a": 0, "b": 0}, {"b"}, 4, ["a", "b"]),
    ],
)
def test_lora_affinity_filter(
    model: str, loads: dict[str, int], holders: set[str], margin: int, expected: list[str]
) -> None:
    plugin = PLUGINS["lora_affinity"].build({"inflight_margin": margin})
    request = RequestFeatures(model=model)
    assert names(plugin.filter(request, _fleet(loads, holders))) == expected


def test_lora_affinity_rejects_a_negative_margin() -> None:
    with pytest.raises(PluginConfigError, match="inflight_margin must be >= 0"):
        PLUGINS["lora_affinity"].build({"inflight_margin": -1})
