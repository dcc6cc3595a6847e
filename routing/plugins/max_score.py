"""Picker: choose the highest weighted total; ties are broken uniformly at random.

A random tie-break (not "first wins") keeps equally good replicas evenly used, e.g. an idle
fleet under least_inflight. Branch "max_score" for a unique best, "max_score_tie" otherwise.
Totals within tie_epsilon of the best count as tied, so float rounding in the weighted sum
does not break ties arbitrarily.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import choose, near_best
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the max_score picker."""

    seed: int | None = param(None, "seed of the tie-break generator (None: from the OS)")
    tie_epsilon: float = param(1e-9, "totals within this of the best are tied")

    def __post_init__(self) -> None:
        if not self.tie_epsilon >= 0.0:
            raise ValueError(f"tie_epsilon must be >= 0, got {self.tie_epsilon}")


class MaxScore:
    """Picks the best total, uniformly among ties."""

    __slots__ = ("_eps", "_rng")

    def __init__(self, params: Params) -> None:
        self._rng = random.Random(params.seed)
        self._eps = params.tie_epsilon

    def pick(
        self,
        request: RequestFeatures,
        replicas: Sequence[ReplicaSnapshot],
        totals: Sequence[float],
    ) -> Pick:
        best = near_best(totals, self._eps)
        if len(best) == 1:
            return Pick(best[0], Branch.MAX_SCORE)
        return Pick(choose(self._rng, best), Branch.MAX_SCORE_TIE)


FACTORY = PluginFactory(__name__, __doc__, "picker", Params, MaxScore)
