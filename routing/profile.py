"""Routing profiles: which filters, weighted scorers, picker and cache tiers a Router runs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from routing.plugin import AnyFactory, Kind
from routing.registry import PLUGINS
from routing.types import TIERS, PluginConfigError, Tier

# These two dataclasses are also the TOML schema of [routing.profiles.<name>]: the gateway's
# strict loader builds them, so a key here is a config key and a type here is checked there.


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One plugin in a profile: registry type, weight (scorers only) and params."""

    type: str
    weight: float = 1.0
    # Any: raw config values; each plugin's factory checks and types its own.
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """A pipeline: filters in order, weighted scorers, one picker, the cache tiers followed."""

    picker: PluginSpec
    filters: tuple[PluginSpec, ...] = ()
    scorers: tuple[PluginSpec, ...] = ()
    # The tier whose candidate becomes request.affinity_replica: the first of these, in this
    # order, that has one (the Router resolves it before any plugin runs). () follows none.
    affinity: tuple[Tier, ...] = TIERS
    # The profile's key in BUILTIN_PROFILES or [routing.profiles]; names it in messages.
    name: str = ""


def _where(profile: str, slot: str = "") -> str:
    head = f"profile {profile!r}" if profile else "profile"
    return f"{head} {slot}" if slot else head


def _lookup(
    profile: str, slot: str, spec: object, kind: Kind, plugins: Mapping[str, AnyFactory]
) -> AnyFactory:
    where = _where(profile, slot)
    if not isinstance(spec, PluginSpec):
        raise PluginConfigError(f"{where}: expected a plugin spec, got {spec!r}")
    factory = plugins.get(spec.type)
    if factory is None:
        known = ", ".join(sorted(n for n, f in plugins.items() if f.kind == kind))
        raise PluginConfigError(f"{where}: unknown {kind} {spec.type!r} (known: {known})")
    if factory.kind != kind:
        raise PluginConfigError(
            f"{where}: {spec.type!r} is a {factory.kind}, it cannot be used as a {kind}"
        )
    if kind == "scorer":
        if not (math.isfinite(spec.weight) and spec.weight >= 0.0):
            raise PluginConfigError(
                f"{where}: weight of {spec.type!r} must be finite and >= 0, got {spec.weight}"
            )
    elif spec.weight != 1.0:
        raise PluginConfigError(f"{where}: {spec.type!r} is a {kind}; only scorers take a weight")
    return factory


def resolve_profile(
    profile: ProfileSpec, plugins: Mapping[str, AnyFactory] = PLUGINS
) -> tuple[list[AnyFactory], list[AnyFactory], AnyFactory]:
    """Factories for (filters, scorers, picker), or PluginConfigError with a clear message."""
    name = profile.name
    if profile.picker is None:
        raise PluginConfigError(f"{_where(name)}: no picker (every profile needs exactly one)")
    filters = [
        _lookup(name, f"filters[{i}]", s, "filter", plugins) for i, s in enumerate(profile.filters)
    ]
    scorers = [
        _lookup(name, f"scorers[{i}]", s, "scorer", plugins) for i, s in enumerate(profile.scorers)
    ]
    picker = _lookup(name, "picker", profile.picker, "picker", plugins)
    seen: set[str] = set()
    for spec in (*profile.filters, *profile.scorers):
        if spec.type in seen:
            raise PluginConfigError(f"{_where(name)}: plugin {spec.type!r} appears twice")
        seen.add(spec.type)
    for i, tier in enumerate(profile.affinity):
        if tier not in TIERS:
            known = ", ".join(sorted(TIERS))
            where = _where(name, f"affinity[{i}]")
            raise PluginConfigError(f"{where}: unknown tier {tier!r} (known: {known})")
        if tier in profile.affinity[:i]:
            raise PluginConfigError(f"{_where(name, 'affinity')}: tier {tier!r} appears twice")
    return filters, scorers, picker


def validate_profile(profile: ProfileSpec, plugins: Mapping[str, AnyFactory] = PLUGINS) -> None:
    """Check types, kinds, duplicates, weights and every plugin's params; raise on the first."""
    filters, scorers, picker = resolve_profile(profile, plugins)
    specs = (*profile.filters, *profile.scorers, profile.picker)
    for factory, spec in zip((*filters, *scorers, picker), specs, strict=True):
        factory.parse(spec.params)


# model_version keeps a request on its model version's replicas ([traffic]); it passes every
# replica through when no version is configured.
_ELIGIBLE = (PluginSpec("healthy"), PluginSpec("serves_model"), PluginSpec("model_version"))
# A replica with a long vLLM waiting queue takes no new requests: they wait in the gateway's
# admission queue instead. Only that limit: measured (benchmarks/results/2026-11-29b-routing-sim/
# analysis.md), a KV-usage limit turns cache hits into misses under load, because a prefix
# holder runs with its cache nearly full by design; vLLM queues a request that does not fit.
_SATURATION = PluginSpec("saturation", params={"max_waiting": 64.0, "max_kv_usage": None})
_AFFINITY_FILTERS = (*_ELIGIBLE, _SATURATION, PluginSpec("lora_affinity"))
# The guard measured best on the shared-prefix workload (same report): stick to the holder
# until its load passes 2 x the mean + 8; the plugin's own defaults (1.5 x mean + 2) gave
# away hits under load (benchmarks/results/2026-11-29-routing-sim/analysis.md).
# A match under 1/8 of the holder's KV cache earns that share of the allowance: a short system
# prompt is cheap to copy, so its first holders should not take every new conversation
# (benchmarks/results/2026-11-30-routing-sim/analysis.md).
# The share window (256 picks) bounds what the load guard cannot at low concurrency: with 4 in
# flight on real vLLM a common system prompt's first holder drew every new conversation (half
# the requests on one of 4 replicas); with it every round stayed within 1.5x max/min share at
# the same hit rate (benchmarks/results/2026-12-02-share-bound-vllm-cpu/analysis.md).
# New prefixes go to the replica that started the fewest within 4 requests of the least load:
# with a band of 1, real vLLM's uneven prefill times kept one replica out of reach while others
# took 6 of 20 groups (benchmarks/results/2026-12-05-start-balance).
# A session yields to a holder with as much of its prompt and over one request fewer in flight:
# a user of a shared system prompt gains nothing from their earlier replica, and following it
# split a hot group by users (60/40), not by load (benchmarks/results/2026-12-08-session-yield).
_GUARD = PluginSpec(
    "affinity_guard",
    params={
        "guard_ratio": 2.0,
        "guard_slack": 8.0,
        "full_allowance_share": 0.125,
        "share_window": 256,
        "inflight": 0.5,
        "join_slack": 1.0,
        "share_band": 4.0,
        "yield_slack": 1.0,
    },
)
# A request placed by load waits for the prefill queued ahead of it, not for the answers being
# decoded, so token_load (prompt tokens sent and not yet answered: the gateway's own exact
# count) weighs four times least_inflight. At 1, a replica a few requests lighter but still
# prefilling took the next miss: TTFT p90 on prompts that share nothing was 1.4-1.5x
# round-robin's at 30-40 req/s; at 4 it is round-robin's up to 30 req/s and within 0.01-0.04 s
# above (benchmarks/results/2026-12-07-token-load/analysis.md).
_LOAD_SCORERS = (
    PluginSpec("least_inflight", 1.0),
    PluginSpec("queue_load", 1.0),
    PluginSpec("kv_utilization", 1.0),
    PluginSpec("token_load", 4.0),
)


def _prefix(name: str) -> ProfileSpec:
    # The affinity_guard picker walks the prefix holders first, under its load guard (as
    # measured, see _GUARD). The prefix_affinity score then only ranks replicas matching fewer
    # than min_match_blocks: never at the default of 1, but a profile that raises it keeps a
    # preference for partial matches, weighed as much as two load signals.
    # cache_footprint (place new prefixes on the emptiest cache) is left out: measured, it
    # matched load-only placement on the shared-prefix workload, and after a workload shift
    # a replica full of stale cache got no new requests for seconds
    # (benchmarks/results/2026-11-29c-routing-sim/analysis.md).
    scorers = (*_LOAD_SCORERS[:3], PluginSpec("prefix_affinity", 2.0), _LOAD_SCORERS[3])
    return ProfileSpec(_GUARD, _AFFINITY_FILTERS, scorers, name=name)


BUILTIN_PROFILES: Mapping[str, ProfileSpec] = MappingProxyType(
    {
        "round_robin": ProfileSpec(PluginSpec("round_robin"), _ELIGIBLE, name="round_robin"),
        "random": ProfileSpec(PluginSpec("random"), _ELIGIBLE, name="random"),
        "least_load": ProfileSpec(
            PluginSpec("max_score"), _ELIGIBLE, (PluginSpec("least_inflight"),), name="least_load"
        ),
        # Sticky sessions (a repeated prompt, then the session id), released by the load
        # guard; misses and guarded requests go by load. No prefix holders nor homes: with
        # them this profile decided exactly as `default` does, so the benchmark compared two
        # runs of one policy (benchmarks/results/2026-11-29d-routing-sim/analysis.md).
        "session": ProfileSpec(
            PluginSpec("affinity_guard", params={**_GUARD.params, "prefix_holders": False}),
            _AFFINITY_FILTERS,
            _LOAD_SCORERS,
            affinity=("prompt_cache", "session"),
            name="session",
        ),
        "prefix": _prefix("prefix"),
        # The prefix profile: with no KV events the gateway fills prefix_match from its
        # approximate index, and with no index data at all it degrades to pure load balancing.
        "default": _prefix("default"),
    }
)
