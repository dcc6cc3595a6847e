"""Filter: keep replicas whose labels match a configured label and the request's hints.

Labels describe an instance class (e.g. precision "fp16" / "int4", or an architecture).
A configured `key` = `value` is a hard constraint: replicas without it are dropped. Request
hints (RequestFeatures.hints: the client's `x-model-hint: precision=int4, arch=h100` header
or gRPC metadata, see gateway/proxy/hints.py) keep only replicas whose labels match every
hint; a request with no hints passes through. A hint that no candidate matches is a
preference, not a constraint, unless `hints_required`: then the set empties and the router
reports that no replica fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the label filter."""

    key: str = param("", "label every replica must carry ('' = none)")
    value: str = param("", "value the label must have")
    use_hints: bool = param(True, "match request hints against replica labels")
    hints_required: bool = param(False, "no replica matching the hints means no replica")

    def __post_init__(self) -> None:
        if self.value and not self.key:
            raise ValueError("value needs a key")


def with_labels(
    replicas: Sequence[ReplicaSnapshot], labels: Mapping[str, str]
) -> list[ReplicaSnapshot]:
    """The replicas whose labels include every one of `labels` (key and value)."""
    items = labels.items()
    return [r for r in replicas if all(r.labels.get(k) == v for k, v in items)]


class Label:
    """Keeps replicas matching the configured label and the request's hints."""

    __slots__ = ("_p", "_required")

    def __init__(self, params: Params) -> None:
        self._p = params
        self._required = {params.key: params.value} if params.key else {}

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        p = self._p
        kept = with_labels(replicas, self._required) if self._required else replicas
        hints = request.hints
        if p.use_hints and hints and kept:
            matching = with_labels(kept, hints)
            if matching or p.hints_required:
                kept = matching
        return kept


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, Label)
