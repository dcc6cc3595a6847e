"""The Router: exclude -> filters -> clamped weighted scorers -> picker, one Decision out."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from routing.plugin import AnyFactory
from routing.profile import ProfileSpec, resolve_profile
from routing.registry import PLUGINS
from routing.types import (
    Decision,
    Filter,
    NoReplicaError,
    Picker,
    ReplicaSnapshot,
    RequestFeatures,
    RoutingError,
    Scorer,
)


class Router:
    """Routes requests with one profile; stateful plugins make it one instance per process."""

    __slots__ = ("_filters", "_name", "_picker", "_scorers")

    def __init__(self, profile: ProfileSpec, plugins: Mapping[str, AnyFactory] = PLUGINS) -> None:
        filters, scorers, picker = resolve_profile(profile, plugins)
        self._name = profile.name
        self._filters: tuple[tuple[str, Filter], ...] = tuple(
            (s.type, f.build(s.params)) for f, s in zip(filters, profile.filters, strict=True)
        )
        self._scorers: tuple[tuple[str, float, Scorer], ...] = tuple(
            (s.type, s.weight, f.build(s.params))
            for f, s in zip(scorers, profile.scorers, strict=True)
        )
        self._picker: Picker = picker.build(profile.picker.params)

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
        candidates = replicas
        if exclude:
            candidates = [r for r in replicas if r.name not in exclude]
            if not candidates:
                raise NoReplicaError(request.model, "every replica was already tried")
        for name, filt in self._filters:
            candidates = filt.filter(request, candidates)
            if not candidates:
                raise NoReplicaError(
                    request.model, f"filter {name!r} removed every replica", filter_name=name
                )

        n = len(candidates)
        totals = [0.0] * n
        scores: dict[str, Mapping[str, float]] = {}
        for name, weight, scorer in self._scorers:
            raw = scorer.score(request, candidates)
            if len(raw) != n:
                raise RoutingError(f"scorer {name!r} returned {len(raw)} scores for {n} replicas")
            # Clamp into [0, 1]; NaN fails both comparisons and lands on 0.
            clamped = [s if 0.0 <= s <= 1.0 else (1.0 if s > 1.0 else 0.0) for s in raw]
            for i, s in enumerate(clamped):
                totals[i] += weight * s
            scores[name] = {r.name: s for r, s in zip(candidates, clamped, strict=True)}

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
