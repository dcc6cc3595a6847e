"""Picker: rotate over the candidates, ignoring scores.

One counter per Router, taken modulo the current candidate count: a changing candidate set
still gets an even share, with no per-replica bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The round_robin picker has no parameters."""


class RoundRobin:
    """Picks candidates in turn."""

    __slots__ = ("_next",)

    def __init__(self, params: Params) -> None:
        del params
        self._next = 0

    def pick(
        self,
        request: RequestFeatures,
        replicas: Sequence[ReplicaSnapshot],
        totals: Sequence[float],
    ) -> Pick:
        index = self._next % len(replicas)
        self._next = index + 1
        return Pick(index, Branch.ROUND_ROBIN)


FACTORY = PluginFactory(__name__, __doc__, "picker", Params, RoundRobin)
