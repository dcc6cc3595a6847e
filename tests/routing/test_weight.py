from __future__ import annotations

import pytest

from routing import PLUGINS
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([1.0], [1.0]),
        ([1.0, 1.0], [1.0, 1.0]),
        ([1.0, 2.0, 4.0], [0.25, 0.5, 1.0]),
        ([0.0, 3.0], [0.0, 1.0]),
        ([0.0, 0.0], [0.0, 0.0]),
    ],
)
def test_weight_scores(weights: list[float], expected: list[float]) -> None:
    reps = [replica(f"r{i}", weight=w) for i, w in enumerate(weights)]
    assert list(PLUGINS["weight"].build({}).score(REQUEST, reps)) == pytest.approx(expected)
