"""Picker: stick to a replica that has the request's cache, while its load and share are in line.

Load guard: scoring.load <= guard_ratio x mean load + guard_slack. 1. request.affinity_replica
passing it, unless prefix_holders and out-held (scoring.outheld): "prompt_cache_hit", "session",
"prefix_home". 2. Holders (scoring.held >= min_match_blocks; in flight counts with w >= inflight)
by longest match, least load, fewest recent picks, top total, at random; the first passing wins
("prefix_hit"). A match filling s < full_allowance_share of the holder's KV earns w = s /
full_allowance_share of the allowance above the least load and passes while its count of the last
share_window picks <= mean + w x ((share_ratio - 1) x mean + share_slack) (all, affinity too, with
share_all). Unbound (the guard cannot bind), a new conversation skips a holder with over join_slack
more new conversations than the fewest unless first to join its prefix there. 3. A holder failed:
"share_guard" or "load_guard"; 4. none held: "miss_by_load": best total in the guards (unbound:
fewest picks or starts in share_band of least).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory, param
from routing.scoring import affinity_branch, allowance, choose, held, load, near_best, outheld
from routing.share import Shares, ShareWindow
from routing.types import Branch, Pick, ReplicaSnapshot, RequestFeatures

_TIE_EPSILON = 1e-9
Totals = Sequence[float]
Replicas = Sequence[ReplicaSnapshot]


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the affinity_guard picker."""

    guard_ratio: float = param(1.5, "load allowed relative to the mean candidate load")
    guard_slack: float = param(2.0, "requests allowed above guard_ratio x mean load")
    min_match_blocks: int = param(1, "matched prefix blocks that make a replica a holder")
    prefix_holders: bool = param(True, "follow prefix holders (tier 2, step 2)")
    full_allowance_share: float | None = param(None, "KV share a match fills for the whole guard")
    inflight: float | None = param(None, "least w making a prefix in flight a holder (None: off)")
    share_window: int = param(0, "recent picks each replica's share is counted over (0: off)")
    share_ratio: float = param(2.0, "share allowed relative to the mean recent share")
    share_slack: float = param(8.0, "picks allowed above share_ratio x mean recent share")
    share_all: bool = param(False, "bound full matches and affinity too (w = 1)")
    share_band: float = param(1.0, "load above the least placed by fewest picks (bound only)")
    join_slack: float | None = param(None, "new conversations above the fewest's (None: off)")
    seed: int | None = param(None, "seed of the tie-break generator (None: from the OS)")

    def __post_init__(self) -> None:
        share = self.full_allowance_share
        checks = {
            "guard_ratio >= 1, guard_slack >= 0": self.guard_ratio >= 1 and self.guard_slack >= 0,
            "min_match_blocks >= 1": self.min_match_blocks >= 1,
            "full_allowance_share in (0, 1] or None": share is None or 0 < share <= 1,
            "share_window >= 0, share_band >= 0": min(self.share_window, self.share_band) >= 0,
            "share_ratio >= 1, share_slack >= 0": self.share_ratio >= 1 and self.share_slack >= 0,
            "join_slack >= 0 or None": self.join_slack is None or self.join_slack >= 0,
        }
        if failed := [rule for rule, ok in checks.items() if not ok]:
            raise ValueError("need " + "; ".join(failed))


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
        elif i >= 0 and loads[i] <= limit and not (p.prefix_holders and outheld(request, target)):
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
