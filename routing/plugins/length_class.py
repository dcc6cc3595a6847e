"""Filter: long prompts to the replicas of an instance class, e.g. `class = long-context`.

A request whose prompt has more than `min_prompt_tokens` tokens keeps only the replicas
labelled `key` = `value`; a shorter one, with `short_avoids_class`, keeps only the others, so
the class stays free for the prompts that need it. When the request's side is empty the
filter keeps every candidate (the gateway then labels the decision `class_fallback`, see
`in_class`), unless `required`: then no replica fits. Put it before `saturation` for a long
prompt to wait for a busy class rather than fall back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the length_class filter."""

    min_prompt_tokens: int = param(8192, "prompts longer than this go to the class")
    key: str = param("class", "label naming the class")
    value: str = param("long-context", "label value of the class")
    short_avoids_class: bool = param(True, "shorter prompts keep off the class when they can")
    required: bool = param(False, "an empty class means no replica (no fallback)")

    def __post_init__(self) -> None:
        if self.min_prompt_tokens < 0:
            raise ValueError("min_prompt_tokens must be >= 0")
        if not self.key or not self.value:
            raise ValueError("key and value must be non-empty")


def wants_class(params: Params, request: RequestFeatures) -> bool:
    """The request belongs to the class (its prompt is long)."""
    return request.prompt_tokens > params.min_prompt_tokens


def in_class(params: Params, request: RequestFeatures, replica: ReplicaSnapshot) -> bool:
    """The replica is on the request's side (False: the filter fell back)."""
    labelled = replica.labels.get(params.key) == params.value
    if wants_class(params, request):
        return labelled
    return not labelled or not params.short_avoids_class


class LengthClass:
    """Keeps the candidates on the request's side of the class, or all of them."""

    __slots__ = ("_p",)

    def __init__(self, params: Params) -> None:
        self._p = params

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        p = self._p
        long = wants_class(p, request)
        if not long and not p.short_avoids_class:
            return replicas
        kept = [r for r in replicas if (r.labels.get(p.key) == p.value) is long]
        if kept or (long and p.required):
            return kept
        return replicas


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, LengthClass)
