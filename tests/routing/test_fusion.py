from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


def _fusion(qps_n: float, mem: float, latency_ms: float) -> float:
    lat_n = min(1.0, max(0.01, 1000 / (latency_ms + 1)) / 100)
    return 0.4 * qps_n + 0.35 * (1 - min(1.0, mem)) + 0.25 * lat_n


@pytest.mark.parametrize(
    ("weight", "mem", "ttft_p99_s", "expected"),
    [
        (2.0, 0.5, 0.1, _fusion(1.0, 0.5, 100)),
        (1.0, 0.5, 0.1, _fusion(0.5, 0.5, 100)),
        (2.0, 0.0, 0.0, 1.0),  # lat_n capped at 1 below ~9 ms
        (2.0, 1.2, 120.0, _fusion(1.0, 1.0, 120000)),  # latency floor 0.01/100
    ],
)
def test_fusion_matches_the_document(
    weight: float, mem: float, ttft_p99_s: float, expected: float
) -> None:
    reps = [
        replica("peak", weight=2.0, gpu_mem_used_frac=0.5, ttft_p99_s=0.1),
        replica("x", weight=weight, gpu_mem_used_frac=mem, ttft_p99_s=ttft_p99_s),
    ]
    scores = PLUGINS["fusion"].build({}).score(REQUEST, reps)
    assert scores[1] == pytest.approx(expected)
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_fusion_missing_input_is_neutral() -> None:
    reps = [
        replica("a", gpu_mem_used_frac=0.2, ttft_p99_s=0.05),
        replica("b", gpu_mem_used_frac=0.8, ttft_p99_s=0.5),
        replica("no-latency", gpu_mem_used_frac=0.1),
        replica("no-memory", ttft_p99_s=0.01),
    ]
    a, b, no_lat, no_mem = PLUGINS["fusion"].build({}).score(REQUEST, reps)
    assert no_lat == no_mem == pytest.approx((a + b) / 2)


def test_fusion_with_zero_weights_everywhere() -> None:
    reps = [replica("a", weight=0.0, kv_usage=0.5, ttft_p99_s=0.1)]
    assert PLUGINS["fusion"].build({}).score(REQUEST, reps) == pytest.approx(
        [_fusion(0.0, 0.5, 100)]
    )


def test_fusion_rejects_negative_weight() -> None:
    with pytest.raises(PluginConfigError, match="fusion"):
        PLUGINS["fusion"].build({"lat_weight": -1})
