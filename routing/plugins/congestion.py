"""Scorer: the seed document's congestion score (000 §2.4), turned into higher-is-better.

As written (higher = more congested):
    congestion = 0.6 * min(1, backlog / max_backlog) + 0.4 * (1 - occupancy)
    backlog = vllm:num_requests_waiting (the `waiting` field); occupancy = gpu_util (NVML),
    else kv_usage, standing in for the CUDA stream occupancy a Python gateway cannot read.
score = 1 - congestion, except the heavy tier (backlog > heavy_backlog and occupancy <
heavy_occupancy), where the document admits no new requests: score 0. The light and medium
tiers' concurrency limits belong to admission control, not to a scorer. A replica missing
either input gets the neutral score (routing.scoring.settle).

The parameters default to the document's figures; it gives no max_backlog of its own, so that
defaults to its heavy tier's backlog bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import settle
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the congestion scorer."""

    max_backlog: float = param(128.0, "waiting requests that count as fully congested")
    backlog_weight: float = param(0.6, "weight of the backlog term")
    idle_weight: float = param(0.4, "weight of the (1 - occupancy) term")
    heavy_backlog: float = param(128.0, "above this backlog (and low occupancy) score 0")
    heavy_occupancy: float = param(0.4, "below this occupancy (and high backlog) score 0")

    def __post_init__(self) -> None:
        if not self.max_backlog > 0:
            raise ValueError(f"max_backlog must be > 0, got {self.max_backlog}")
        if min(self.backlog_weight, self.idle_weight) < 0:
            raise ValueError("term weights must be >= 0")


class Congestion:
    """Scores 1 - congestion, 0 in the heavy tier."""

    __slots__ = ("_p",)

    def __init__(self, params: Params) -> None:
        self._p = params

    def value(self, r: ReplicaSnapshot) -> float | None:
        """Higher-is-better score of one replica, or None when an input is unknown."""
        p = self._p
        occupancy = r.gpu_util if r.gpu_util is not None else r.kv_usage
        if r.waiting is None or occupancy is None:
            return None
        if r.waiting > p.heavy_backlog and occupancy < p.heavy_occupancy:
            return 0.0
        backlog = min(1.0, max(0.0, r.waiting) / p.max_backlog)
        return 1.0 - (p.backlog_weight * backlog + p.idle_weight * (1.0 - occupancy))

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        return settle([self.value(r) for r in replicas], replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, Congestion)
