"""Picker: choose a candidate uniformly at random, ignoring scores.

Each picker has its own generator: set `seed` for reproducible benchmarks and tests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the random picker."""

    seed: int | None = param(None, "seed of the picker's generator (None: from the OS)")


class RandomPick:
    """Picks a uniformly random candidate."""

    __slots__ = ("_rng",)

    def __init__(self, params: Params) -> None:
        self._rng = random.Random(params.seed)

    def pick(
        self,
        request: RequestFeatures,
        replicas: Sequence[ReplicaSnapshot],
        totals: Sequence[float],
    ) -> Pick:
        return Pick(self._rng.randrange(len(replicas)), Branch.RANDOM)


FACTORY = PluginFactory(__name__, __doc__, "picker", Params, RandomPick)
