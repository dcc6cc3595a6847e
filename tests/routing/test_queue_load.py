from __future__ import annotations

from typing import Any

import pytest

from routing import PLUGINS
from routing.plugins.queue_load import queue
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"waiting": 3.0, "running": 8.0, "in_flight": 8}, 3.0),
        # Five sent since the scrape: the gateway's excess over running outgrows `waiting`.
        ({"waiting": 3.0, "running": 8.0, "in_flight": 16}, 8.0),
        # Other clients' requests show only in `waiting`.
        ({"waiting": 12.0, "running": 8.0, "in_flight": 2}, 12.0),
        ({"waiting": 4.0, "in_flight": 30}, 4.0),
        ({"running": 8.0, "in_flight": 11}, 3.0),
        ({"running": 8.0, "in_flight": 2}, 0.0),
        ({"in_flight": 9}, None),
    ],
)
def test_queue_length(fields: dict[str, Any], expected: float | None) -> None:
    assert queue(replica("a", **fields)) == expected


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ([{"waiting": 0.0}, {"waiting": 1.0}, {"waiting": 3.0}], [1.0, 0.75, 0.25]),
        ([{"waiting": 2.0}, {"waiting": 2.0}], [1.0, 1.0]),
        # Burst: equal scraped queues, but "b" got 4 more requests since the scrape.
        (
            [
                {"waiting": 1.0, "running": 4.0, "in_flight": 5},
                {"waiting": 1.0, "running": 4.0, "in_flight": 9},
            ],
            [1.0, 0.2],
        ),
        # Unknown queue: neutral (the mean of the known scores).
        ([{"waiting": 0.0}, {"waiting": 1.0}, {}], [1.0, 0.5, 0.75]),
        ([{}, {}], [0.5, 0.5]),
    ],
)
def test_queue_load_scores(fleet: list[dict[str, Any]], expected: list[float]) -> None:
    reps = [replica(f"r{i}", **f) for i, f in enumerate(fleet)]
    assert PLUGINS["queue_load"].build({}).score(REQUEST, reps) == pytest.approx(expected)
