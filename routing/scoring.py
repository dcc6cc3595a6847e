"""Helpers for scorers that read scraped replica fields, which may be unknown or stale."""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import ReplicaSnapshot, RequestFeatures

NEUTRAL = 0.5


def settle(values: Sequence[float | None], replicas: Sequence[ReplicaSnapshot]) -> list[float]:
    """Unknown (None) scores become neutral; stale ones are pulled toward neutral by freshness.

    Neutral is the mean of the known scores among the candidates (0.5 if none is known), so a
    replica we know nothing about is neither favoured nor shunned relative to its peers, and an
    all-unknown fleet scores all-equal (the scorer then expresses no preference).
    """
    known = [v for v in values if v is not None]
    neutral = sum(known) / len(known) if known else NEUTRAL
    out: list[float] = []
    for v, r in zip(values, replicas, strict=True):
        if v is None:
            out.append(neutral)
        else:
            f = min(1.0, max(0.0, r.freshness))
            out.append(neutral + f * (v - neutral))
    return out


def mem_frac(r: ReplicaSnapshot) -> float | None:
    """Used fraction of GPU memory from NVML, else vLLM's KV-cache usage (both 0..1)."""
    return r.gpu_mem_used_frac if r.gpu_mem_used_frac is not None else r.kv_usage


def relative(values: Sequence[float], unit: float = 1.0) -> list[float]:
    """1 for the lowest value, falling by 1 / (spread + unit) per `unit` above it.

    `unit` is the difference worth caring about (one request, a few hundred tokens): spreads
    smaller than it barely move the scores, and equal values all score 1.
    """
    low = min(values)
    scale = 1.0 / (max(values) - low + unit)
    return [1.0 - (x - low) * scale for x in values]


_AFFINITY_BRANCH: dict[str | None, str] = {
    "session": "session",
    "prompt_cache": "prompt_cache_hit",
    "prefix_home": "prefix_home",
}


def affinity_branch(request: RequestFeatures) -> str:
    """The branch label of a pick that followed request.affinity_replica (by its kind)."""
    return _AFFINITY_BRANCH.get(request.affinity_kind, "prompt_cache_hit")


def load(r: ReplicaSnapshot) -> float:
    """Requests on the replica: the gateway's in-flight count, or vLLM's running + waiting.

    The larger of the two: in_flight sees a burst before the next scrape, running + waiting
    sees requests from other clients (other gateway replicas, direct users).
    """
    if r.running is None or r.waiting is None:
        return float(r.in_flight)
    return max(float(r.in_flight), r.running + r.waiting)
