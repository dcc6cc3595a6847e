"""Scorer: prefer replicas with free KV cache: score = 1 - kv_usage (vllm:kv_cache_usage_perc).

A replica with no KV reading yet gets the neutral score and a stale reading leans toward it
(routing.scoring.settle), so an unscraped replica is neither favoured nor shunned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.scoring import settle
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The kv_utilization scorer has no parameters."""


class KvUtilization:
    """Scores free KV-cache fraction."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        values = [None if r.kv_usage is None else 1.0 - r.kv_usage for r in replicas]
        return settle(values, replicas)


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, KvUtilization)
