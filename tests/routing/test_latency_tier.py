from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("p99", "expected"),
    [
        (0.0, 1.0),
        (0.079, 1.0),
        (0.08, 1.0),  # yellow starts at 1.0: the tiers join without a step
        (0.14, 0.7),
        (0.2, 0.4),
        (0.2001, 0.1),
        (3.0, 0.1),
    ],
)
def test_latency_tier_matches_the_document(p99: float, expected: float) -> None:
    plugin = PLUGINS["latency_tier"].build({})
    assert plugin.tier(p99) == pytest.approx(expected)
    assert plugin.score(REQUEST, [replica("a", ttft_p99_s=p99)]) == pytest.approx([expected])


def test_latency_tier_can_read_itl() -> None:
    r = replica("a", ttft_p99_s=5.0, itl_p99_s=0.05)
    assert PLUGINS["latency_tier"].build({"latency": "itl_p99_s"}).score(REQUEST, [r]) == [1.0]
    assert PLUGINS["latency_tier"].build({}).score(REQUEST, [r]) == [0.1]


def test_latency_tier_unknown_is_neutral() -> None:
    reps = [replica("green", ttft_p99_s=0.01), replica("red", ttft_p99_s=1.0), replica("new")]
    assert PLUGINS["latency_tier"].build({}).score(REQUEST, reps) == pytest.approx([1.0, 0.1, 0.55])


@pytest.mark.parametrize(
    ("raw", "message"),
    [({"latency": "e2e"}, "latency must be one of"), ({"green_s": 0.3}, "green_s < red_s")],
)
def test_latency_tier_rejects_bad_params(raw: dict[str, object], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        PLUGINS["latency_tier"].build(raw)
