"""Scorer: prefer the replica with the fewest requests in flight through this gateway.

score = 1 - (in_flight - min) / (max - min + 1), over the candidates: the least loaded
scores 1, every extra request costs 1 / (spread + 1), equal loads all score 1. The
gateway's own in-flight count is exact and never lags a burst, unlike scraped metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.scoring import relative
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The least_inflight scorer has no parameters."""


class LeastInflight:
    """Scores candidates by their in-flight count relative to the least loaded one."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        return relative([float(r.in_flight) for r in replicas])


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, LeastInflight)
