"""Picker: the replica where this request would start soonest, in prefill tokens.

Continuous batching admits a request into the running batch at once; what delays its first
token is prefill: its own uncached tokens, and the prefill queued ahead of it. A cache miss
on a long shared prompt costs the whole replica a long prefill step, so a busy holder of the
prefix usually still beats an idle replica that must prefill it again. The cost of replica r:

    cost(r) = (1 - hit(r)) * prompt_tokens      its own prefill
            + r.queued_prefill_tokens            prefill the gateway sent and r has not done
            + decode_weight * load(r)            each running request slows r's steps

hit(r) is the share of the prompt r holds (tier 2 matched blocks x block_tokens; tier 1 or a
session pointing at r counts as `affinity_hit` when the prefix index knows less, since the
same prompt or conversation was served there). The cheapest replica wins; ties (an idle,
cold fleet) are broken at random, so misses spread instead of piling onto one replica.
Saturated replicas are the saturation filter's business, not this picker's.

Branches: "prompt_cache_hit" / "session" / "prefix_home" (the affinity replica won, by its
tier), "prefix_hit" (a holder won), "load_guard" (a holder existed but another replica was
cheaper), "miss_by_load".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import affinity_branch, choose, load, near_best
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures

# Costs within this many tokens are a tie.
_TIE_TOKENS = 1.0


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the prefill_cost picker."""

    decode_weight: float = param(8.0, "prefill tokens one running request is worth")
    affinity_hit: float = param(1.0, "hit share assumed on the tier-1 / session replica")
    seed: int | None = param(None, "seed of the tie-break generator (None: from the OS)")

    def __post_init__(self) -> None:
        if self.decode_weight < 0:
            raise ValueError(f"decode_weight must be >= 0, got {self.decode_weight}")
        if not 0.0 <= self.affinity_hit <= 1.0:
            raise ValueError(f"affinity_hit must be in [0, 1], got {self.affinity_hit}")


def hit_share(request: RequestFeatures, replica: str, affinity_hit: float) -> float:
    """The share of the prompt `replica` is believed to hold."""
    tokens = request.prompt_tokens
    share = 0.0
    if tokens > 0:
        share = min(1.0, request.prefix_match.get(replica, 0) * request.block_tokens / tokens)
    if replica == request.affinity_replica:
        share = max(share, affinity_hit)
    return share


class PrefillCost:
    """Cheapest estimated time to first token, counted in prefill tokens."""

    __slots__ = ("_p", "_rng")

    def __init__(self, params: Params) -> None:
        self._p = params
        self._rng = random.Random(params.seed)

    def pick(
        self,
        request: RequestFeatures,
        replicas: Sequence[ReplicaSnapshot],
        totals: Sequence[float],
    ) -> Pick:
        p = self._p
        prompt = request.prompt_tokens
        hits = [hit_share(request, r.name, p.affinity_hit) for r in replicas]
        # Negated, so the cheapest is the highest (negation is exact: the same ties).
        neg_costs = [
            -((1.0 - h) * prompt + r.queued_prefill_tokens + p.decode_weight * load(r))
            for r, h in zip(replicas, hits, strict=True)
        ]
        i = choose(self._rng, near_best(neg_costs, _TIE_TOKENS))
        if hits[i] > 0.0:
            if replicas[i].name == request.affinity_replica:
                return Pick(i, affinity_branch(request))
            return Pick(i, Branch.PREFIX_HIT)
        return Pick(i, Branch.LOAD_GUARD if any(hits) else Branch.MISS_BY_LOAD)


FACTORY = PluginFactory(__name__, __doc__, "picker", Params, PrefillCost)
