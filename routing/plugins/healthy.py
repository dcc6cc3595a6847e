"""Filter: drop replicas marked unhealthy by health checks or outlier detection.

A returning replica the gateway has sit a decision out (`admitted` false, its ramp back to
a full share) is dropped like an unhealthy one.

When the healthy fraction of the candidates falls below panic_threshold, every candidate is
kept (Envoy's panic mode). At 0 it never panics, so an all-unhealthy fleet yields no
candidate and the gateway answers 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the healthy filter."""

    panic_threshold: float = param(0.0, "below this healthy fraction keep all (0 = never)")

    def __post_init__(self) -> None:
        if not 0.0 <= self.panic_threshold <= 1.0:
            raise ValueError(f"panic_threshold must be in [0, 1], got {self.panic_threshold}")


class Healthy:
    """Keeps healthy replicas (or all of them in panic mode)."""

    __slots__ = ("_panic",)

    def __init__(self, params: Params) -> None:
        self._panic = params.panic_threshold

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        kept = [r for r in replicas if r.healthy and r.admitted]
        if len(kept) == len(replicas):
            return replicas
        if self._panic > 0.0 and len(kept) < self._panic * len(replicas):
            return replicas
        return kept


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, Healthy)
