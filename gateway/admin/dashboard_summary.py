"""GET /admin/summary: fleet totals, recent routing, latency, the admission queue and errors.

Read from the runtime's own state and metric objects (never from /metrics text), for the
dashboard to poll beside GET /admin/replicas; counters are cumulative, the page takes rates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from routing.types import Branch
from telemetry.metrics import Sample

if TYPE_CHECKING:
    from gateway.runtime import Runtime

# Decisions that followed a cache tier: the routing-side hit rate of a replica.
_AFFINITY = frozenset(
    {Branch.PROMPT_CACHE_HIT, Branch.SESSION, Branch.PREFIX_HOME, Branch.PREFIX_HIT}
)
_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
# The families the summary reads (the others a collection yields are dropped).
_WANTED = {
    "llm_gateway_requests",
    "llm_gateway_routing_decisions",
    "llm_gateway_routing_decision_share",
    "llm_gateway_routing_decision_window",
    "llm_gateway_upstream_retries",
    "llm_gateway_retries_refused",
    "llm_gateway_streams_truncated",
    "llm_gateway_time_to_first_token_seconds",
    "llm_gateway_request_duration_seconds",
}


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) pairs; None if empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # past the last finite bound: its bound is all that is known
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _histogram(family: list[Sample] | None) -> dict[str, Any]:
    """Percentiles of a histogram family, every label (model) merged."""
    by_le: dict[float, float] = {}
    count = 0.0
    total = 0.0
    for s in family if family is not None else ():
        if s.name.endswith("_bucket"):
            le = float(s.labels["le"])
            by_le[le] = by_le.get(le, 0.0) + s.value
        elif s.name.endswith("_count"):
            count += s.value
        elif s.name.endswith("_sum"):
            total += s.value
    buckets = sorted(by_le.items())
    out: dict[str, Any] = {name: quantile(q, buckets) for name, q in _QUANTILES}
    out["count"] = int(count)
    out["mean"] = total / count if count else None
    return out


def _sum(family: list[Sample] | None, suffix: str = "_total") -> float:
    return float(sum(s.value for s in _samples(family, suffix)))


def _samples(family: list[Sample] | None, suffix: str) -> Iterable[Sample]:
    if family is None:
        return ()
    return (s for s in family if s.name.endswith(suffix))


def _by(family: list[Sample] | None, label: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in _samples(family, "_total"):
        key = s.labels[label]
        out[key] = out.get(key, 0) + int(s.value)
    return out


def _by_replica(family: list[Sample] | None) -> dict[str, dict[str, int]]:
    """Per replica: decisions since start, and those that followed a cache tier."""
    out: dict[str, dict[str, int]] = {}
    for s in _samples(family, "_total"):
        row = out.setdefault(s.labels["replica"], {"decisions": 0, "affinity": 0})
        row["decisions"] += int(s.value)
        if s.labels["branch"] in _AFFINITY:
            row["affinity"] += int(s.value)
    return out


def _fleet(views: list[dict[str, Any]]) -> dict[str, Any]:
    kv = [v["load"]["kv_usage"] for v in views if v["load"]["kv_usage"] is not None]
    return {
        "replicas": len(views),
        "routable": sum(1 for v in views if v["routable"]),
        "healthy": sum(1 for v in views if v["healthy"]),
        "drained": sum(1 for v in views if v["drained"]),
        "ejected": sum(1 for v in views if v["ejected"]),
        "in_flight": sum(v["in_flight"] for v in views),
        "running": sum(v["load"]["running"] or 0 for v in views),
        "waiting": sum(v["load"]["waiting"] or 0 for v in views),
        "kv_usage_mean": sum(kv) / len(kv) if kv else None,
        "cached_blocks": sum(v["cached_blocks"] for v in views),
    }


def _queue(runtime: Runtime) -> dict[str, Any]:
    admission = runtime.admission
    tenants = runtime.tenancy.queue_depth(admission)
    if admission is None:
        return {"enabled": False, "total": 0, "by_bucket": [], "by_tenant": tenants}
    depth = admission.queue.depth()
    return {
        "enabled": True,
        "total": sum(depth.values()),
        "by_bucket": [{"model": m, "bucket": b, "depth": n} for (m, b), n in depth.items()],
        "by_tenant": tenants,
        "admitted_after_wait": admission.admitted_after_wait,
        "rejected_full": admission.rejected_full,
        "rejected_timeout": admission.rejected_timeout,
    }


def summary(runtime: Runtime, views: list[dict[str, Any]]) -> dict[str, Any]:
    """The dashboard's second poll; `views` is GET /admin/replicas' list, for the totals."""
    families = runtime.metrics.samples(_WANTED)
    share = families.get("llm_gateway_routing_decision_share")
    window = families.get("llm_gateway_routing_decision_window")
    requests = families.get("llm_gateway_requests")
    decisions = families.get("llm_gateway_routing_decisions")
    by_status = _by(requests, "status")
    return {
        "at": time.time(),
        "profile": runtime.router.profile_name,
        "draining": runtime.draining,
        # With --workers N each process answers for itself: the page names the one it reads.
        "worker": {"index": runtime.worker_index, "count": runtime.worker_count},
        "fleet": _fleet(views),
        "decisions": {
            "window": int(_sum(window, "")),
            "share": {s.labels["replica"]: s.value for s in _samples(share, "")},
            "by_branch": _by(decisions, "branch"),
            "by_replica": _by_replica(decisions),
        },
        "requests": {
            "total": sum(by_status.values()),
            "by_status": by_status,
            "errors": sum(n for status, n in by_status.items() if int(status) >= 400),
            "retries": int(_sum(families.get("llm_gateway_upstream_retries"))),
            "retries_refused": int(_sum(families.get("llm_gateway_retries_refused"))),
            "streams_truncated": int(_sum(families.get("llm_gateway_streams_truncated"))),
        },
        "latency": {
            "ttft_s": _histogram(families.get("llm_gateway_time_to_first_token_seconds")),
            "duration_s": _histogram(families.get("llm_gateway_request_duration_seconds")),
        },
        "queue": _queue(runtime),
        "errors": [
            {
                "replica": v["name"],
                "errors_total": v["errors_total"],
                "consecutive_failures": v["consecutive_failures"],
                "last_error": v["last_error"],
            }
            for v in views
            if v["last_error"] or v["errors_total"]
        ],
    }
