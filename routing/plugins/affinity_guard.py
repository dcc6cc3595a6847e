"""Picker: stick to a replica that has the request's cache, while its load and share are in line.

Load guard: scoring.load <= guard_ratio x mean load + guard_slack. 1. request.affinity_replica
passing it, unless prefix_holders and out-held (scoring.outheld) or undercut by yield_slack
(scoring.undercut): "prompt_cache_hit", "session", "prefix_home". 2. Holders (scoring.held >=
min_match_blocks; in flight counts with w >= inflight) by longest match, least load, fewest
recent picks, top total, at random; the first passing wins ("prefix_hit"). A match filling
s < full_allowance_share of the holder's KV earns w = s / full_allowance_share of the allowance
above the least load and passes while its count of the last share_window picks <= mean + w x
((share_ratio - 1) x mean + share_slack) (all, affinity too, with share_all). Unbound (the
guard cannot bind), a new conversation skips a holder with over join_slack more new
conversations than the fewest unless first to join its prefix there. 3. A holder failed:
"share_guard" or "load_guard"; 4. none held: "miss_by_load": best total in the guards (unbound:
fewest picks or starts in share_band of least).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from routing import scoring
from routing.affinity_guard_params import Params
from routing.plugin import PluginFactory
from routing.scoring import affinity_branch, allowance, choose, held, load, near_best, outheld
from routing.share import Shares, ShareWindow
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures

_TIE_EPSILON = 1e-9
Totals = Sequence[float]
Replicas = Sequence[ReplicaSnapshot]


class AffinityGuard:
    """Affinity first, prefix holders next, load last; every pick names its branch."""

    __slots__ = ("_joined", "_p", "_rng", "reads_inflight", "share")

    def __init__(self, params: Params) -> None:
        self._p, self._rng = params, random.Random(params.seed)
        self.share = ShareWindow(params.share_window, params.join_slack)
        self._joined: int | None = None  # the prefix the last pick joined (its deepest block)
        self.reads_inflight = params.inflight is not None

    def pick(self, request: RequestFeatures, replicas: Replicas, totals: Totals) -> Pick:
        pick = self._pick(request, replicas, totals)
        self.share.record(replicas[pick.index].name, not request.affinity_replica, self._joined)
        return pick

    def _follows(self, request: RequestFeatures, replicas: Replicas, loads: Totals, i: int) -> bool:
        p = self._p
        if not p.prefix_holders:
            return True
        if outheld(request, replicas[i].name):
            return False
        if p.yield_slack is None:
            return True
        share, least_w = p.full_allowance_share, p.inflight
        return not scoring.undercut(
            loads, i, p.yield_slack, lambda j: held(request, replicas[j], share, least_w)
        )

    def _pick(self, request: RequestFeatures, replicas: Replicas, totals: Totals) -> Pick:
        p, n, self._joined = self._p, len(replicas), None
        loads = [load(r) for r in replicas]
        limit = p.guard_ratio * sum(loads) / n + p.guard_slack
        shares = Shares(self.share.counts(replicas), p.share_ratio, p.share_slack)
        bound, over, target = sum(loads) <= limit, set[int](), request.affinity_replica or ""
        joins = self.share.joins(replicas) if bound and not target else None
        i = next((i for i, r in enumerate(replicas) if r.name == target), -1) if target else -1
        if i >= 0 and bound and p.share_all and shares.over(i):
            over.add(i)
        elif i >= 0 and loads[i] <= limit and self._follows(request, replicas, loads, i):
            return Pick(i, affinity_branch(request))
        guarded, limits = i >= 0, [limit] * n
        if p.prefix_holders and (request.prefix_match or request.inflight_match):
            holders = [
                (-m, loads[i], shares.count(i) if bound else 0, -totals[i], self._rng.random(), i)
                for i, r in enumerate(replicas)
                if (m := held(request, r, p.full_allowance_share, p.inflight)) >= p.min_match_blocks
            ]
            least, hashes = min(loads), request.block_hashes
            for neg_m, lo, *_, i in sorted(holders):
                w = allowance(request, replicas[i], -neg_m, p.full_allowance_share)
                limits[i] = least + w * (limit - least)
                free = not bound or (w >= 1.0 and not p.share_all)
                prefix = hashes[-neg_m - 1] if -neg_m <= len(hashes) else None
                if (joins and joins.refused(i, prefix)) or (not free and shares.over(i, w)):
                    over.add(i)
                elif lo <= limits[i]:
                    self._joined = prefix
                    return Pick(i, Branch.PREFIX_HIT)
            guarded = guarded or bool(holders)
        # A holder over its guard or share is left out, or its prefix score could win it back.
        pool = [i for i, lo in enumerate(loads) if lo <= limits[i] and i not in over] or [*range(n)]
        if bound and p.share_window:
            pool = (joins or shares).evenly(pool, loads, p.share_band)
        index = choose(self._rng, near_best(totals, _TIE_EPSILON, pool))
        branch = Branch.SHARE_GUARD if over else Branch.LOAD_GUARD
        return Pick(index, branch if guarded else Branch.MISS_BY_LOAD)


FACTORY = PluginFactory(__name__, __doc__, "picker", Params, AffinityGuard)
