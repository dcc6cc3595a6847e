"""Scorer: the seed document's composite node score (000 §1), turned into higher-is-better.

As written (lower is better):
    mem = used_mem / total_mem                 (gpu_mem_used_frac, else kv_usage)
    kv = 1 - min(kv_cap, active_kv / kv_divisor)  (active_kv = kv_usage as a percentage)
    batch_penalty = max(0, 1.5 * (batch_len - optimal_batch) / optimal_batch)  (batch = running)
    cost = mem_weight*mem + kv_weight*kv + batch_weight*batch_penalty
Mapped to score = 1 / (1 + cost): monotone, 1 at zero cost, and still ordered when the batch
penalty is large (a clamp at cost 1 would tie every overloaded replica). A replica missing any
input gets the neutral score (see routing.scoring.settle); stale inputs lean toward it.
The term weights default to the document's; optimal_batch is not in the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import mem_frac, settle
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the seed_composite scorer."""

    optimal_batch: float = param(32.0, "batch size (running sequences) a replica runs best at")
    kv_cap: float = param(0.8, "cap of the active-KV fraction in the kv term")
    kv_divisor: float = param(100.0, "divides the active-KV percentage")
    mem_weight: float = param(0.4, "weight of the memory term")
    kv_weight: float = param(0.3, "weight of the kv term")
    batch_weight: float = param(0.3, "weight of the batch penalty")

    def __post_init__(self) -> None:
        if not (self.optimal_batch > 0 and self.kv_divisor > 0):
            raise ValueError("optimal_batch and kv_divisor must be > 0")
        if min(self.kv_cap, self.mem_weight, self.kv_weight, self.batch_weight) < 0:
            raise ValueError("kv_cap and the term weights must be >= 0")


class SeedComposite:
    """Scores 1 / (1 + composite cost)."""

    __slots__ = ("_p",)

    def __init__(self, params: Params) -> None:
        self._p = params

    def cost(self, r: ReplicaSnapshot) -> float | None:
        """The document's lower-is-better score, or None when an input is unknown."""
        p = self._p
        mem = mem_frac(r)
        if mem is None or r.kv_usage is None or r.running is None:
            return None
        kv = 1.0 - min(p.kv_cap, r.kv_usage * 100.0 / p.kv_divisor)
        batch = max(0.0, 1.5 * (r.running - p.optimal_batch) / p.optimal_batch)
        return p.mem_weight * mem + p.kv_weight * kv + p.batch_weight * batch

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        values: list[float | None] = []
        for r in replicas:
            c = self.cost(r)
            values.append(None if c is None else 1.0 / (1.0 + c))
        return settle(values, replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, SeedComposite)
