"""Picker: stick to a replica that has the request's cache, until its load is out of line.

The rule, in order (load = routing.scoring.load: in-flight, or running + waiting if larger;
a replica passes the guard when load <= guard_ratio * mean candidate load + guard_slack,
the slack letting an idle fleet, whose mean is 0, take requests at all):
1. request.affinity_replica (the first of the profile's affinity tiers with a candidate: the
   replica that served this prompt, or this session, or, when no cache holds any of the
   prompt, the replica its prefix was last sent to) is a candidate and passes the guard:
   pick it. Branch "prompt_cache_hit", "session" or "prefix_home" after affinity_kind.
2. Holders: candidates with request.prefix_match >= min_match_blocks (tier 2), by longest
   match, least load, highest total, then at random; the first within its guard wins:
   "prefix_hit". A match filling a share s < full_allowance_share of the holder's KV cache
   earns s / full_allowance_share of the allowance above the least load: a short prefix is
   cheap to copy, so its holders must not draw every request while others idle. With no
   full_allowance_share, or a holder whose cache size is unknown, it earns all of it.
3. An affinity replica or a holder exists but all fail the guard: "load_guard".
4. No affinity and no holder (a cache miss): "miss_by_load".
In 3 and 4 the highest weighted total among the replicas within their guard wins (the least
loaded always is); ties are broken at random, so misses spread instead of piling onto one
"emptiest" replica. As the guard compares against the mean, a burst of identical requests
between two scrapes sticks to the cached replica only until its in-flight count runs ahead.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import affinity_branch, choose, load, near_best
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures

_TIE_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the affinity_guard picker."""

    guard_ratio: float = param(1.5, "load allowed relative to the mean candidate load")
    guard_slack: float = param(2.0, "requests allowed above guard_ratio x mean load")
    min_match_blocks: int = param(1, "matched prefix blocks that make a replica a holder")
    prefix_holders: bool = param(True, "follow prefix holders (tier 2, step 2)")
    full_allowance_share: float | None = param(None, "KV share a match fills for the whole guard")
    seed: int | None = param(None, "seed of the tie-break generator (None: from the OS)")

    def __post_init__(self) -> None:
        if not (self.guard_ratio >= 1.0 and self.guard_slack >= 0.0):
            raise ValueError("need guard_ratio >= 1 and guard_slack >= 0")
        if self.min_match_blocks < 1:
            raise ValueError(f"min_match_blocks must be >= 1, got {self.min_match_blocks}")
        share = self.full_allowance_share
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"full_allowance_share must be in (0, 1] or None, got {share}")


class AffinityGuard:
    """Affinity first, prefix holders next, load last; every pick names its branch."""

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
        loads = [load(r) for r in replicas]
        limit = p.guard_ratio * sum(loads) / len(loads) + p.guard_slack
        guarded = False
        target = request.affinity_replica
        if target is not None:
            i = next((i for i, r in enumerate(replicas) if r.name == target), -1)
            if i >= 0 and loads[i] <= limit:
                return Pick(i, affinity_branch(request))
            guarded = i >= 0
        match = request.prefix_match if p.prefix_holders else None
        limits = [limit] * len(replicas)
        if match:
            holders = [
                (-m, loads[i], -totals[i], self._rng.random(), i)
                for i, r in enumerate(replicas)
                if (m := match.get(r.name, 0)) >= p.min_match_blocks
            ]
            least, full = min(loads), p.full_allowance_share
            for neg_m, lo, _, _, i in sorted(holders):
                cap = replicas[i].cache_capacity_tokens
                w = min(1.0, -neg_m * request.block_tokens / (full * cap)) if full and cap else 1.0
                limits[i] = least + w * (limit - least)
                if lo <= limits[i]:
                    return Pick(i, Branch.PREFIX_HIT)
            guarded = guarded or bool(holders)
        # A holder over its own guard is left out too, or its prefix score could win it back.
        # Never empty in exact arithmetic (the least loaded is within every guard).
        passing = [i for i, lo in enumerate(loads) if lo <= limits[i]] or list(range(len(loads)))
        index = choose(self._rng, near_best(totals, _TIE_EPSILON, passing))
        return Pick(index, Branch.LOAD_GUARD if guarded else Branch.MISS_BY_LOAD)


FACTORY = PluginFactory(__name__, __doc__, "picker", Params, AffinityGuard)
