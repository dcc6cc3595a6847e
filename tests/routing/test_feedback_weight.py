from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("latency", "error", "expected"),
    [
        (0.1, 0.001, 1.0),
        (0.19, 0.0049, 1.0),
        (0.2, 0.001, 0.75),
        (0.5, 0.01, 0.75),
        (0.8, 0.019, 0.75),
        (0.1, 0.01, 0.75),  # fast but erroring: not the top tier
        (0.81, 0.0, 0.2),
        (0.1, 0.02, 0.2),
        (5.0, 0.5, 0.2),
        # Judged on what is known.
        (0.1, None, 1.0),
        (0.5, None, 0.75),
        (None, 0.03, 0.2),
    ],
)
def test_feedback_weight_tiers(latency: float | None, error: float | None, expected: float) -> None:
    plugin = PLUGINS["feedback_weight"].build({})
    r = replica("a", ttft_p99_s=latency, error_rate=error)
    assert plugin.tier(r) == expected
    assert plugin.score(REQUEST, [r]) == [expected]


def test_feedback_weight_nothing_known_is_neutral() -> None:
    reps = [
        replica("good", ttft_p99_s=0.1, error_rate=0.0),
        replica("poor", ttft_p99_s=2.0, error_rate=0.0),
        replica("new"),
    ]
    assert PLUGINS["feedback_weight"].build({}).score(REQUEST, reps) == pytest.approx(
        [1.0, 0.2, 0.6]
    )


def test_feedback_weight_rejects_inverted_bounds() -> None:
    with pytest.raises(PluginConfigError, match="fast_s <= slow_s"):
        PLUGINS["feedback_weight"].build({"fast_s": 1.0})
