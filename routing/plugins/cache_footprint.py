"""Scorer: prefer replicas whose caches hold less, so new prefixes spread evenly.

Reads ReplicaSnapshot.cached_blocks (the gateway's tier-2 index: exact from KV events, else
from routing history) plus the uncached prompt tokens already sent there and not yet past
prefill (queued_prefill_tokens, in blocks): the index learns of a prompt only once its first
token is back, and a burst of new prefixes must not all see the same empty cache.

A cache miss placed by load alone lands wherever in-flight counts happen to be lowest at
that instant; under a burst of new prefixes (a warm-up, a new tenant) that piles several
long prefixes onto one replica, whose cache then cannot hold them and their requests
together, while another replica's cache stays half empty. Scoring the footprint places each
new prefix on the emptiest cache, as SGLang's cache-aware policy picks its smallest tree.
Only misses and guarded requests are placed by scores (affinity_guard), so holders keep
their hits. Replicas without an index score neutral (the candidates' mean).

Not in the built-in profiles: a full cache is not a busy one, so after a workload shift a
replica whose cache is full of stale blocks gets no new prefixes until the others fill up
(measured in benchmarks/results/2026-11-29c-routing-sim/analysis.md). Use it where new
prefixes arrive in bursts onto an otherwise idle fleet. Footprints are normalised over the
candidates (routing.scoring.relative): differences well below unit_blocks barely count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import relative
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the cache_footprint scorer."""

    unit_blocks: float = param(64.0, "cached-block difference that counts as one unit")

    def __post_init__(self) -> None:
        if not self.unit_blocks > 0:
            raise ValueError(f"unit_blocks must be > 0, got {self.unit_blocks}")


class CacheFootprint:
    """Scores indexed cache blocks relative to the emptiest candidate."""

    __slots__ = ("_unit",)

    def __init__(self, params: Params) -> None:
        self._unit = params.unit_blocks

    def score(self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]) -> list[float]:
        per_block = float(max(1, request.block_tokens))
        known = [
            r.cached_blocks + r.queued_prefill_tokens / per_block
            for r in replicas
            if r.cached_blocks is not None
        ]
        if not known:
            return [1.0] * len(replicas)
        scores = relative(known, self._unit)
        # An unknown replica scores the candidates' mean: neither favoured nor shunned.
        neutral = sum(scores) / len(scores)
        it = iter(scores)
        return [next(it) if r.cached_blocks is not None else neutral for r in replicas]


FACTORY = PluginFactory(__name__, __doc__, "scorer", Params, CacheFootprint)
