"""The KV-cache gauge the ScaledObjects scale on: a fresh scrape's value, never a stale one."""

from __future__ import annotations

from typing import Any

from telemetry.metrics import GatewayMetrics
from tests.deploy.manifests import parse_exposition


def _row(name: str, kv: float | None, freshness: float) -> dict[str, Any]:
    return {
        "name": name, "in_flight": 0, "healthy": True, "metrics_age_s": 0.5,
        "freshness": freshness, "gpu_mem_used_frac": None, "gpu_util": None, "kv_usage": kv,
    }  # fmt: skip


def test_kv_usage_is_exported_only_for_freshly_scraped_replicas() -> None:
    rows = [_row("fresh", 0.42, 1.0), _row("stale", 0.99, 0.0), _row("never", None, 0.0)]
    text = GatewayMetrics(lambda: rows).render().decode()
    e = parse_exposition(text)
    assert e.families["llm_gateway_replica_kv_cache_usage_ratio"] == "gauge"
    series = [
        labels for name, labels in e.samples if name == "llm_gateway_replica_kv_cache_usage_ratio"
    ]
    assert series == [{"replica": "fresh"}]
    assert 'llm_gateway_replica_kv_cache_usage_ratio{replica="fresh"} 0.42' in text
