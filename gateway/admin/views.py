"""The admin API's view of each replica: live state as JSON-ready plain values."""

from __future__ import annotations

from typing import Any

from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def replica_view(
    replica: ReplicaState, row: dict[str, Any], origin: str, now: float
) -> dict[str, Any]:
    """One replica: config, health, ejection and ramp, drain, load, scrape, cache, GPU."""
    cfg = replica.config
    m = replica.metrics
    return {
        "name": replica.name,
        "url": cfg.url,
        "origin": origin,
        "models": sorted(replica.models),
        "weight": cfg.weight,
        "labels": dict(cfg.labels),
        "kv_events": cfg.kv_events,
        # Routable: up by health checks, not ejected, not drained.
        "routable": replica.healthy and not replica.drained,
        "healthy": replica.healthy,
        "probe_down": replica.probe_down,
        "drained": replica.drained,
        "ejected": row["ejected"],
        "admit_fraction": row["admit_fraction"],
        "ejections": row["ejections"],
        "in_flight": replica.in_flight,
        "remote_in_flight": getattr(replica, "remote_in_flight", 0),
        "load": {
            "running": m.running if m is not None else None,
            "waiting": m.waiting if m is not None else None,
            "kv_usage": m.kv_usage if m is not None else None,
        },
        "freshness": _round(row["freshness"]),
        "last_scrape_age_s": _round(row["metrics_age_s"], 3),
        "scrape_interval_s": replica.scrape_interval_s,
        "scrapes_total": replica.scrapes_total,
        "scrape_errors": replica.scrape_errors,
        "cached_blocks": replica.cached_blocks,
        "gpu": {
            "mem_used_frac": replica.gpu_mem_used_frac,
            "util": replica.gpu_util,
            "age_s": _round(now - replica.gpu_seen_at, 3) if replica.gpu_seen_at else None,
        },
        "agent": {
            "vllm_healthy": replica.agent_vllm_healthy,
            "age_s": _round(now - replica.agent_seen_at, 3) if replica.agent_seen_at else None,
        },
        "latency": {
            "ttft_p50_s": replica.ttft_p50_s,
            "ttft_p99_s": replica.ttft_p99_s,
            "itl_p99_s": replica.itl_p99_s,
        },
        "requests_total": replica.requests_total,
        "errors_total": replica.errors_total,
        "consecutive_failures": replica.consecutive_failures,
        "last_error": replica.last_error,
    }


def fleet_view(pool: ReplicaPool, origins: dict[str, str]) -> list[dict[str, Any]]:
    """Every replica, in pool order (live_rows also brings the outlier policy up to date)."""
    rows = {row["name"]: row for row in pool.live_rows()}
    now = pool.clock()
    return [replica_view(r, rows[r.name], origins.get(r.name, "config"), now) for r in pool]


# What each worker has of its own: its requests and counts, its probes' and outlier's verdict.
_PER_WORKER = (
    "routable",
    "healthy",
    "drained",
    "ejected",
    "admit_fraction",
    "in_flight",
    "requests_total",
    "errors_total",
)
_SUMMED = ("in_flight", "requests_total", "errors_total")


def merge_views(views: list[tuple[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Several workers' rows as one per replica: counts summed, each worker's under `workers`.

    The other fields are the first worker's that has the replica (the answering one first); a
    replica that only some workers have lists only those under `workers`.
    """
    merged: dict[str, dict[str, Any]] = {}
    for index, rows in views:
        for row in rows:
            out = merged.get(row["name"])
            if out is None:
                out = merged[row["name"]] = {**row, "workers": {}, **dict.fromkeys(_SUMMED, 0)}
            out["workers"][str(index)] = {k: row[k] for k in _PER_WORKER}
            for k in _SUMMED:
                out[k] += row[k]
    return list(merged.values())
