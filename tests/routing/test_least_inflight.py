from __future__ import annotations

import pytest

from routing import PLUGINS
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ([0], [1.0]),
        ([0, 0, 0], [1.0, 1.0, 1.0]),
        ([7, 7], [1.0, 1.0]),
        ([0, 1], [1.0, 0.5]),
        ([10, 11], [1.0, 0.5]),
        ([0, 1, 2, 3], [1.0, 0.75, 0.5, 0.25]),
        ([3, 0, 3], [0.25, 1.0, 0.25]),
    ],
)
def test_least_inflight_scores(loads: list[int], expected: list[float]) -> None:
    reps = [replica(f"r{i}", in_flight=x) for i, x in enumerate(loads)]
    scores = PLUGINS["least_inflight"].build({}).score(REQUEST, reps)
    assert list(scores) == pytest.approx(expected)


def test_least_inflight_is_in_unit_interval_and_monotone() -> None:
    loads = [5, 0, 300, 17, 17, 2]
    reps = [replica(f"r{i}", in_flight=x) for i, x in enumerate(loads)]
    scores = list(PLUGINS["least_inflight"].build({}).score(REQUEST, reps))
    assert all(0.0 < s <= 1.0 for s in scores)
    by_load = [s for _, s in sorted(zip(loads, scores, strict=True))]
    assert by_load == sorted(by_load, reverse=True)
