"""Filter: keep replicas that serve the requested model (base model or LoRA adapter name)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The serves_model filter has no parameters."""


class ServesModel:
    """Keeps replicas whose `models` contains request.model."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        model = request.model
        return [r for r in replicas if model in r.models]


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, ServesModel)
