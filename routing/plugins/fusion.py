"""Scorer: the seed document's multi-dimensional fusion weight (000 §2.1), higher is better.

    qps_n = min(1, qps / max_qps)            qps = configured weight, max_qps = the largest among
                                             the candidates (snapshots carry no measured
                                             throughput; weight is the operator's capacity)
    mem_n = 1 - min(1, vram_used / total)    (gpu_mem_used_frac, else kv_usage)
    lat_n = min(1, max(0.01, 1000 / (latency_ms + 1)) / 100)   latency = ttft_p99_s
    score = qps_weight*qps_n + mem_weight*mem_n + lat_weight*lat_n
As written lat_n exceeds 1 below ~9 ms; it is capped at 1 so the fused score stays in [0, 1].
A replica missing memory or latency gets the neutral score (routing.scoring.settle).
The weights default to the document's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import mem_frac, settle
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the fusion scorer."""

    qps_weight: float = param(0.4, "weight of the capacity (qps) term")
    mem_weight: float = param(0.35, "weight of the free-memory term")
    lat_weight: float = param(0.25, "weight of the latency term")

    def __post_init__(self) -> None:
        if min(self.qps_weight, self.mem_weight, self.lat_weight) < 0:
            raise ValueError("term weights must be >= 0")


class Fusion:
    """Scores capacity, free memory and P99 latency fused."""

    __slots__ = ("_p",)

    def __init__(self, params: Params) -> None:
        self._p = params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        p = self._p
        top = max(r.weight for r in replicas)
        values: list[float | None] = []
        for r in replicas:
            mem = mem_frac(r)
            if mem is None or r.ttft_p99_s is None:
                values.append(None)
                continue
            qps_n = min(1.0, r.weight / top) if top > 0 else 0.0
            mem_n = 1.0 - min(1.0, mem)
            lat_n = min(1.0, max(0.01, 1000.0 / (r.ttft_p99_s * 1000.0 + 1.0)) / 100.0)
            values.append(p.qps_weight * qps_n + p.mem_weight * mem_n + p.lat_weight * lat_n)
        return settle(values, replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, Fusion)
