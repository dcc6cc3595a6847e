"""Filter: send a LoRA request to replicas that already have its adapter loaded.

If some candidates list request.model in loaded_adapters, only they are kept, which saves
an adapter load (and an eviction) elsewhere, unless every one of them is saturated: its
in-flight count exceeds the least loaded other candidate's by more than `inflight_margin`.
Then every candidate stays, and the load scorers decide. No candidate with the adapter
loaded (a base model, or an adapter nobody has loaded yet), or no other candidate: all kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the lora_affinity filter."""

    inflight_margin: int = param(4, "in-flight excess over the idlest non-holder that saturates")

    def __post_init__(self) -> None:
        if self.inflight_margin < 0:
            raise ValueError(f"inflight_margin must be >= 0, got {self.inflight_margin}")


class LoraAffinity:
    """Keeps the replicas with the request's adapter loaded while they have room."""

    __slots__ = ("_margin",)

    def __init__(self, params: Params) -> None:
        self._margin = params.inflight_margin

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        model = request.model
        holders = [r for r in replicas if model in r.loaded_adapters]
        if not holders or len(holders) == len(replicas):
            return replicas
        idlest = min(r.in_flight for r in replicas if model not in r.loaded_adapters)
        if all(r.in_flight > idlest + self._margin for r in holders):
            return replicas
        return holders


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, LoraAffinity)
