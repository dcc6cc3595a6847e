from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("waiting", "gpu_util", "kv_usage", "expected"),
    [
        (0.0, 1.0, None, 1.0),
        (0.0, 0.8, None, 1 - 0.4 * 0.2),
        (64.0, 0.8, None, 1 - (0.6 * 0.5 + 0.4 * 0.2)),
        (128.0, 0.5, None, 1 - (0.6 + 0.4 * 0.5)),
        (500.0, 0.9, None, 1 - (0.6 + 0.4 * 0.1)),  # backlog term saturates at 1
        (129.0, 0.39, None, 0.0),  # heavy tier: admit nothing
        (16.0, None, 0.75, 1 - (0.6 * 0.125 + 0.4 * 0.25)),  # occupancy from kv_usage
    ],
)
def test_congestion_matches_the_document(
    waiting: float, gpu_util: float | None, kv_usage: float | None, expected: float
) -> None:
    r = replica("a", waiting=waiting, gpu_util=gpu_util, kv_usage=kv_usage)
    assert PLUGINS["congestion"].build({}).score(REQUEST, [r]) == pytest.approx([expected])


def test_congestion_missing_input_is_neutral() -> None:
    reps = [
        replica("free", waiting=0.0, gpu_util=1.0),
        replica("heavy", waiting=200.0, gpu_util=0.1),
        replica("no-queue", gpu_util=0.5),
        replica("no-occupancy", waiting=3.0),
    ]
    assert PLUGINS["congestion"].build({}).score(REQUEST, reps) == pytest.approx(
        [1.0, 0.0, 0.5, 0.5]
    )


def test_congestion_rejects_zero_max_backlog() -> None:
    with pytest.raises(PluginConfigError, match="max_backlog must be > 0"):
        PLUGINS["congestion"].build({"max_backlog": 0})
