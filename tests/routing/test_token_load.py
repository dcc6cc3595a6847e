from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("tokens", "unit", "expected"),
    [
        ([0, 0], 512.0, [1.0, 1.0]),
        ([0, 512], 512.0, [1.0, 0.5]),
        ([1000, 0, 3000], 1000.0, [0.75, 1.0, 0.25]),
        # A small spread relative to the unit barely matters.
        ([0, 16], 512.0, [1.0, 1 - 16 / 528]),
        ([8000, 8000, 0], 1.0, [1 / 8001, 1 / 8001, 1.0]),
    ],
)
def test_token_load_scores_queued_prefill_tokens(
    tokens: list[int], unit: float, expected: list[float]
) -> None:
    reps = [replica(f"r{i}", queued_prefill_tokens=t) for i, t in enumerate(tokens)]
    plugin = PLUGINS["token_load"].build({"unit_tokens": unit})
    assert plugin.score(REQUEST, reps) == pytest.approx(expected)


def test_token_load_rejects_a_zero_unit() -> None:
    with pytest.raises(PluginConfigError, match="unit_tokens must be > 0"):
        PLUGINS["token_load"].build({"unit_tokens": 0})
