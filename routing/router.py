"""The Router: affinity tier -> exclude -> filters -> clamped weighted scorers -> picker."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import fields
from operator import attrgetter

from routing.plugin import AnyFactory
from routing.profile import ProfileSpec, resolve_profile
from routing.registry import PLUGINS
from routing.share import ShareWindow
from routing.types import (
    Decision,
    Filter,
    NoReplicaError,
    Picker,
    ReplicaSnapshot,
    RequestFeatures,
    RoutingError,
    Saturated,
    Scorer,
    Tier,
)

# The RequestFeatures field holding each tier's candidate.
_TIER_FIELD: Mapping[Tier, str] = {
    "prompt_cache": "prompt_cache_replica",
    "session": "session_replica",
    "prefix_home": "prefix_home_replica",
}
# Copied positionally, at half the cost of dataclasses.replace: it runs on every request that
# has an affinity candidate.
_FIELDS = tuple(f.name for f in fields(RequestFeatures))
_ALL_FIELDS = attrgetter(*_FIELDS)
_REPLICA_AT, _KIND_AT = _FIELDS.index("affinity_replica"), _FIELDS.index("affinity_kind")


class Router:
    """Routes requests with one profile; stateful plugins make it one instance per process."""

    __slots__ = ("_filters", "_name", "_picker", "_scorers", "_tiers", "reads_inflight")

    def __init__(self, profile: ProfileSpec, plugins: Mapping[str, AnyFactory] = PLUGINS) -> None:
        filters, scorers, picker = resolve_profile(profile, plugins)
        self._name = profile.name
        self._tiers = tuple((t, _TIER_FIELD[t]) for t in profile.affinity)
        built = [(s.type, f.build(s.params)) for f, s in zip(filters, profile.filters, strict=True)]
        # (name, filter, saturating): see Filter for what a saturating filter is.
        self._filters: tuple[tuple[str, Filter, bool], ...] = tuple(
            (name, f, getattr(f, "saturating", False) is True) for name, f in built
        )
        self._scorers: tuple[tuple[str, float, Scorer], ...] = tuple(
            (s.type, s.weight, f.build(s.params))
            for f, s in zip(scorers, profile.scorers, strict=True)
        )
        self._picker: Picker = picker.build(profile.picker.params)
        # Whether the picker reads RequestFeatures.inflight_match (else it need not be kept).
        self.reads_inflight = getattr(self._picker, "reads_inflight", False) is True

    @property
    def profile_name(self) -> str:
        """Name of the profile this router runs."""
        return self._name

    def route(
        self,
        request: RequestFeatures,
        replicas: Sequence[ReplicaSnapshot],
        exclude: Collection[str] = (),
    ) -> Decision:
        """Choose a replica for `request`, never one named in `exclude` (earlier tries)."""
        if not replicas:
            raise NoReplicaError(request.model, "no replicas configured")
        if request.affinity_replica is None:
            request = self._follow_tiers(request)
        candidates = replicas
        if exclude:
            candidates = [r for r in replicas if r.name not in exclude]
            if not candidates:
                raise NoReplicaError(request.model, "every replica was already tried")
        for name, filt, saturating in self._filters:
            candidates = filt.filter(request, candidates)
            if not candidates:
                error = Saturated if saturating else NoReplicaError
                raise error(request.model, f"filter {name!r} removed every replica")

        n = len(candidates)
        if n == 1:
            return self._route_one(request, candidates)
        totals = [0.0] * n
        scores: dict[str, Mapping[str, float]] = {}
        # List-at-a-time (the same sums in the same order as a per-index loop, at half its cost).
        names = [r.name for r in candidates]
        for name, weight, scorer in self._scorers:
            raw = scorer.score(request, candidates)
            if len(raw) != n:
                raise RoutingError(f"scorer {name!r} returned {len(raw)} scores for {n} replicas")
            # Clamp into [0, 1]; NaN fails both comparisons and lands on 0.
            clamped = [s if 0.0 <= s <= 1.0 else (1.0 if s > 1.0 else 0.0) for s in raw]
            totals = [t + weight * s for t, s in zip(totals, clamped, strict=True)]
            scores[name] = dict(zip(names, clamped, strict=True))

        pick = self._picker.pick(request, candidates, totals)
        if not 0 <= pick.index < n:
            raise RoutingError(f"picker chose index {pick.index} of {n} candidates")
        return Decision(
            replica=candidates[pick.index],
            branch=pick.branch,
            total=totals[pick.index],
            scores=scores,
            candidates=n,
        )

    def _route_one(
        self, request: RequestFeatures, candidates: Sequence[ReplicaSnapshot]
    ) -> Decision:
        """`route`'s scoring and pick for one candidate: the same sums, without the lists."""
        # One candidate left (one replica, or the filters kept one): on Python 3.11 each list
        # comprehension is a function call, three per scorer, most of route()'s own time.
        only = candidates[0].name
        total = 0.0
        scores: dict[str, Mapping[str, float]] = {}
        for name, weight, scorer in self._scorers:
            raw = scorer.score(request, candidates)
            if len(raw) != 1:
                raise RoutingError(f"scorer {name!r} returned {len(raw)} scores for 1 replicas")
            s = raw[0]
            clamped = s if 0.0 <= s <= 1.0 else (1.0 if s > 1.0 else 0.0)
            total = total + weight * clamped
            scores[name] = {only: clamped}
        pick = self._picker.pick(request, candidates, [total])
        if pick.index != 0:
            raise RoutingError(f"picker chose index {pick.index} of 1 candidates")
        return Decision(
            replica=candidates[0], branch=pick.branch, total=total, scores=scores, candidates=1
        )

    def last_share(self) -> tuple[bool, int | None] | None:
        """(new conversation, prefix it joined) of the last pick, as the picker's share window
        counted it; None when the picker keeps no window (nothing for other processes)."""
        share = getattr(self._picker, "share", None)
        return share.last if isinstance(share, ShareWindow) and share.counting else None

    def observe(self, replica: str, new: bool, prefix: int | None) -> None:
        """A pick another gateway process made, counted by the picker's share window if any."""
        share = getattr(self._picker, "share", None)
        if isinstance(share, ShareWindow):
            share.observe(replica, new, prefix)

    def affinity(self, request: RequestFeatures) -> tuple[str | None, Tier | None]:
        """The (affinity_replica, affinity_kind) that `route` follows for `request`."""
        followed = self._follow_tiers(request) if request.affinity_replica is None else request
        return followed.affinity_replica, followed.affinity_kind

    def totals(self, decision: Decision) -> dict[str, float]:
        """Each candidate's weighted total in `decision`, summed as `route` summed it."""
        # Off the hot path (decision logs): `route` keeps its totals in a list, unlabelled.
        out: dict[str, float] = {}
        for name, weight, _ in self._scorers:
            for replica, s in decision.scores.get(name, {}).items():
                out[replica] = out.get(replica, 0.0) + weight * s
        return out

    def _follow_tiers(self, request: RequestFeatures) -> RequestFeatures:
        """`request` with the candidate of the profile's first tier that has one, if any."""
        # Once, before the filters: a tier whose replica is then filtered out or already tried
        # does not hand over to the next tier; the picker goes on to prefix holders and load.
        for tier, name in self._tiers:
            replica: str | None = getattr(request, name)
            if replica is not None:
                values = list(_ALL_FIELDS(request))
                values[_REPLICA_AT], values[_KIND_AT] = replica, tier
                return RequestFeatures(*values)
        return request
