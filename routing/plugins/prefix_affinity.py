"""Scorer: prefer replicas that already hold the request's leading prompt blocks in KV cache.

score = matched leading blocks / total prompt blocks, where matched comes from
request.prefix_match[replica.name] (filled by the cache index: exact from vLLM's KV events,
else approximate from routing history) and the total is len(request.block_hashes). A prompt
with no full block, or a replica the index knows nothing about, scores 0. This scorer knows
nothing about load: pair it with load scorers, and use the affinity_guard picker so a hot
prefix does not pile onto one replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The prefix_affinity scorer has no parameters."""


class PrefixAffinity:
    """Scores the matched fraction of the prompt's blocks."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        total = len(request.block_hashes)
        match = request.prefix_match
        if total == 0 or not match:
            return [0.0] * len(replicas)
        inv = 1.0 / total
        return [min(1.0, match.get(r.name, 0) * inv) for r in replicas]


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, PrefixAffinity)
