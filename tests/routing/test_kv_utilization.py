from __future__ import annotations

import pytest

from routing import PLUGINS
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("usage", "fresh", "expected"),
    [
        ([0.0, 0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 0.5, 0.0]),
        ([0.2, None], [1.0, 1.0], [0.8, 0.8]),
        ([None, None], [1.0, 1.0], [0.5, 0.5]),
        # A fully stale reading carries no information: it sits at the mean of the known.
        ([0.0, 1.0], [1.0, 0.0], [1.0, 0.5]),
    ],
)
def test_kv_utilization_scores_free_kv(
    usage: list[float | None], fresh: list[float], expected: list[float]
) -> None:
    reps = [
        replica(f"r{i}", kv_usage=u, freshness=f)
        for i, (u, f) in enumerate(zip(usage, fresh, strict=True))
    ]
    assert PLUGINS["kv_utilization"].build({}).score(REQUEST, reps) == pytest.approx(expected)
