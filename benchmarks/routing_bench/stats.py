"""Statistics of one run: percentiles, imbalance, throughput and hit rate per rate step."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SATURATED_CORES = 0.9  # a process above this share of one core is flagged as saturated
# Cores used by processes outside the benchmark above which a step is flagged: the machine is
# shared, and a step where others took the CPU measures them, not the router.
CONTENDED_CORES = 0.5
_OURS = ("fleet", "contender", "loadgen")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between ranks; None when empty."""
    if not values:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def imbalance(samples: Iterable[Sequence[float]]) -> float | None:
    """Mean over samples of std/mean of per-replica running requests (idle samples skipped)."""
    ratios = []
    for sample in samples:
        if len(sample) < 2:
            continue
        mean = statistics.fmean(sample)
        if mean > 0:
            ratios.append(statistics.pstdev(sample) / mean)
    return statistics.fmean(ratios) if ratios else None


def ok(rec: Mapping[str, Any]) -> bool:
    return rec.get("status") == 200 and rec.get("error") is None and rec.get("ttft") is not None


def token_itls(rec: Mapping[str, Any]) -> list[float]:
    """Per-token inter-token latencies: each chunk gap spread over the tokens it carried."""
    gaps: list[float] = rec.get("gaps") or []
    tokens = int(rec.get("tokens") or 0)
    if not gaps or tokens < 2:
        return []
    per_chunk = (tokens - 1) / len(gaps)
    return [g / per_chunk for g in gaps]


def tokens_in_window(rec: Mapping[str, Any], start: float, end: float) -> float:
    """Output tokens this request delivered between start and end (wall-clock seconds)."""
    if rec.get("ttft") is None:
        return 0.0
    gaps: list[float] = rec.get("gaps") or []
    tokens = int(rec.get("tokens") or 0) or (1 + len(gaps))
    per_chunk = (tokens - 1) / len(gaps) if gaps else 0.0
    t = float(rec["sent"]) + float(rec["ttft"])
    n = 1.0 if start <= t < end else 0.0
    for g in gaps:
        t += g
        if start <= t < end:
            n += per_chunk
    return n


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Replica counters and per-process CPU seconds at one instant."""

    t: float
    hits: float
    queries: float
    cpu: Mapping[str, float]
    preemptions: float = 0.0


def hit_rate(a: Snapshot, b: Snapshot) -> float | None:
    dq = b.queries - a.queries
    return (b.hits - a.hits) / dq if dq > 0 else None


def cpu_use(a: Snapshot, b: Snapshot) -> dict[str, float]:
    """Cores used by each process group between two snapshots."""
    dt = b.t - a.t
    if dt <= 0:
        return {}
    return {k: round((b.cpu[k] - a.cpu.get(k, 0.0)) / dt, 3) for k in b.cpu if k in a.cpu}


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def cached_token_rate(good: Sequence[Mapping[str, Any]]) -> float | None:
    """Cached over prompt tokens, from the answers' usage (those that reported both)."""
    cached = [r for r in good if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    if not cached:
        return None
    hits = sum(float(r["cached_tokens"]) for r in cached)
    return hits / sum(float(r["prompt_tokens"]) for r in cached)


def error_kinds(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Failed requests by kind: the HTTP status, else (200, or no answer yet) the start of the
    error."""
    errors: dict[str, int] = {}
    for r in records:
        if not ok(r):
            # Status 0: the load generator gave up (or lost the connection) before any status
            # came back; its error says which, "HTTP 0" would not.
            status = r.get("status")
            key = f"HTTP {status}" if status not in (0, 200) else str(r.get("error"))[:60]
            errors[key] = errors.get(key, 0) + 1
    return errors


def step_row(
    records: Sequence[Mapping[str, Any]],
    start: Snapshot,
    end: Snapshot,
    running: Iterable[Sequence[float]],
    all_records: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The measured figures of one rate step (records = the requests sent during it)."""
    good = [r for r in records if ok(r)]
    ttft = [float(r["ttft"]) for r in good]
    itl = [x for r in good for x in token_itls(r)]
    e2e = [float(r["e2e"]) for r in good if r.get("e2e") is not None]
    lags = [float(r["sent"]) - float(r["sched"]) for r in records]
    window = end.t - start.t
    tokens = sum(tokens_in_window(r, start.t, end.t) for r in all_records)
    cpu = cpu_use(start, end)
    if "machine" in cpu:
        cpu["others"] = round(max(0.0, cpu.pop("machine") - sum(cpu.get(k, 0.0) for k in _OURS)), 3)
    return {
        "requests": len(records),
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p90_s": _r(percentile(ttft, 90)),
        "ttft_p99_s": _r(percentile(ttft, 99)),
        "itl_p50_s": _r(percentile(itl, 50), 5),
        "itl_p99_s": _r(percentile(itl, 99), 5),
        "e2e_p50_s": _r(percentile(e2e, 50)),
        "e2e_p90_s": _r(percentile(e2e, 90)),
        "output_tok_s": round(tokens / window, 1) if window > 0 else None,
        "success_rate": _r(len(good) / len(records)) if records else None,
        "hit_rate": _r(hit_rate(start, end)),
        "cached_token_rate": _r(cached_token_rate(good)),
        # vLLM preempts (and later recomputes) running requests when decode outgrows the KV.
        "preemptions": round(end.preemptions - start.preemptions),
        "imbalance": _r(imbalance(running)),
        "cpu_cores": cpu,
        "cpu_saturated": sorted(k for k in _OURS if cpu.get(k, 0.0) > SATURATED_CORES),
        "contended": cpu.get("others", 0.0) > CONTENDED_CORES,
        "send_lag_p50_ms": _r(_ms(percentile(lags, 50)), 2),
        "send_lag_p99_ms": _r(_ms(percentile(lags, 99)), 2),
        "send_lag_max_ms": _r(_ms(max(lags) if lags else None), 2),
        "errors": error_kinds(records),
    }


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0
