from __future__ import annotations

from typing import Any

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


def _cost(mem: float, kv_usage: float, running: float, optimal: float = 32.0) -> float:
    kv = 1 - min(0.8, kv_usage * 100 / 100)
    batch = max(0.0, 1.5 * (running - optimal) / optimal)
    return 0.4 * mem + 0.3 * kv + 0.3 * batch


@pytest.mark.parametrize(
    ("fields", "cost"),
    [
        ({"gpu_mem_used_frac": 0.5, "kv_usage": 0.5, "running": 16.0}, _cost(0.5, 0.5, 16)),
        ({"gpu_mem_used_frac": 0.9, "kv_usage": 0.95, "running": 64.0}, _cost(0.9, 0.95, 64)),
        # No NVML reading: memory falls back to the KV-cache usage.
        ({"kv_usage": 0.25, "running": 32.0}, _cost(0.25, 0.25, 32)),
        ({"gpu_mem_used_frac": 0.0, "kv_usage": 0.0, "running": 0.0}, 0.3),
    ],
)
def test_seed_composite_matches_the_document(fields: dict[str, Any], cost: float) -> None:
    reps = [replica("a", **fields)]
    plugin = PLUGINS["seed_composite"].build({})
    assert plugin.cost(reps[0]) == pytest.approx(cost)
    assert plugin.score(REQUEST, reps) == pytest.approx([1 / (1 + cost)])


def test_seed_composite_orders_by_cost_even_when_overloaded() -> None:
    reps = [
        replica("ok", gpu_mem_used_frac=0.5, kv_usage=0.5, running=16.0),
        replica("over", gpu_mem_used_frac=0.5, kv_usage=0.5, running=96.0),
        replica("way-over", gpu_mem_used_frac=0.5, kv_usage=0.5, running=320.0),
    ]
    scores = PLUGINS["seed_composite"].build({}).score(REQUEST, reps)
    assert 1.0 >= scores[0] > scores[1] > scores[2] > 0.0


@pytest.mark.parametrize(
    "fields",
    [{"kv_usage": 0.5}, {"running": 8.0}, {"gpu_mem_used_frac": 0.5, "running": 8.0}, {}],
)
def test_seed_composite_missing_input_is_neutral(fields: dict[str, Any]) -> None:
    reps = [
        replica("lo", gpu_mem_used_frac=0.2, kv_usage=0.2, running=4.0),
        replica("hi", gpu_mem_used_frac=0.9, kv_usage=0.9, running=80.0),
        replica("unknown", **fields),
    ]
    lo, hi, unknown = PLUGINS["seed_composite"].build({}).score(REQUEST, reps)
    assert unknown == pytest.approx((lo + hi) / 2)


@pytest.mark.parametrize("raw", [{"optimal_batch": 0}, {"kv_divisor": -1}, {"mem_weight": -0.1}])
def test_seed_composite_rejects_bad_params(raw: dict[str, Any]) -> None:
    with pytest.raises(PluginConfigError, match="seed_composite"):
        PLUGINS["seed_composite"].build(raw)
