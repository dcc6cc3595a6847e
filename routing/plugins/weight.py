"""Scorer: prefer replicas with a larger configured weight (weight / max weight of candidates).

If no candidate has a positive weight every score is 0 (all equal, so no preference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The weight scorer has no parameters."""


class Weight:
    """Scores candidates by configured weight, normalised by the largest."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        top = max(r.weight for r in replicas)
        if not top > 0.0:
            return [0.0] * len(replicas)
        inv = 1.0 / top
        return [r.weight * inv for r in replicas]


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, Weight)
