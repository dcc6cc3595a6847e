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

from collections.abc import Sequence
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


class Label:
    """Keeps replicas matching the configured label and the request's hints."""

    __slots__ = ("_p",)

    def __init__(self, params: Params) -> None:
        self._p = params

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        p = self._p
        kept = replicas
        if p.key:
            kept = [r for r in kept if r.labels.get(p.key) == p.value]
        hints = request.hints
        if p.use_hints and hints and kept:
            items = hints.items()
            matching = [r for r in kept if all(r.labels.get(k) == v for k, v in items)]
            if matching or p.hints_required:
                kept = matching
        return kept


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, Label)
