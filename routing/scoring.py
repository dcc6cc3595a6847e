"""Helpers shared by plugins: scraped fields that may be unknown or stale, load, tie-breaks."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

from routing.types import Branch, ReplicaSnapshot, RequestFeatures, Tier

NEUTRAL = 0.5


def settle(values: Sequence[float | None], replicas: Sequence[ReplicaSnapshot]) -> list[float]:
    """Unknown (None) scores become neutral; stale ones are pulled toward neutral by freshness.

    Neutral is the mean of the known scores among the candidates (0.5 if none is known), so a
    replica we know nothing about is neither favoured nor shunned relative to its peers, and an
    all-unknown fleet scores all-equal (the scorer then expresses no preference).
    """
    known = [v for v in values if v is not None]
    neutral = sum(known) / len(known) if known else NEUTRAL
    out: list[float] = []
    for v, r in zip(values, replicas, strict=True):
        if v is None:
            out.append(neutral)
        else:
            f = min(1.0, max(0.0, r.freshness))
            out.append(neutral + f * (v - neutral))
    return out


def mem_frac(r: ReplicaSnapshot) -> float | None:
    """Used fraction of GPU memory from NVML, else vLLM's KV-cache usage (both 0..1)."""
    return r.gpu_mem_used_frac if r.gpu_mem_used_frac is not None else r.kv_usage


def relative(values: Sequence[float], unit: float = 1.0) -> list[float]:
    """1 for the lowest value, falling by 1 / (spread + unit) per `unit` above it.

    `unit` is the difference worth caring about (one request, a few hundred tokens): spreads
    smaller than it barely move the scores, and equal values all score 1.
    """
    low = min(values)
    scale = 1.0 / (max(values) - low + unit)
    return [1.0 - (x - low) * scale for x in values]


_AFFINITY_BRANCH: Mapping[Tier | None, Branch] = {
    "session": Branch.SESSION,
    "prompt_cache": Branch.PROMPT_CACHE_HIT,
    "prefix_home": Branch.PREFIX_HOME,
}


def affinity_branch(request: RequestFeatures) -> Branch:
    """The branch label of a pick that followed request.affinity_replica (by its kind)."""
    return _AFFINITY_BRANCH.get(request.affinity_kind, Branch.PROMPT_CACHE_HIT)


def near_best(
    values: Sequence[float], epsilon: float, among: Sequence[int] | None = None
) -> list[int]:
    """Indices (of `among`, default all) whose value is within `epsilon` of the highest."""
    # An epsilon, not equality: float rounding in a weighted sum must not break a tie.
    if among is None:
        floor = max(values) - epsilon
        return [i for i, v in enumerate(values) if v >= floor]
    floor = max(values[i] for i in among) - epsilon
    return [i for i in among if values[i] >= floor]


def choose(rng: random.Random, tied: Sequence[int]) -> int:
    """One of the tied indices, uniformly at random; a unique best draws nothing from `rng`."""
    # Random, not "first wins": equally good replicas stay evenly used. No draw for a unique
    # best, so a seeded generator advances only on real ties.
    return tied[0] if len(tied) == 1 else tied[rng.randrange(len(tied))]


def allowance(
    request: RequestFeatures, holder: ReplicaSnapshot, matched: int, full_share: float | None
) -> float:
    """0..1: the share of a load allowance a prefix match of `matched` blocks earns its holder.

    A match filling a share s < full_share of the holder's KV cache earns s / full_share; all
    of it without full_share or when the holder's cache size is unknown.
    """
    cap = holder.cache_capacity_tokens
    if not (full_share and cap):
        return 1.0
    return min(1.0, matched * request.block_tokens / (full_share * cap))


def held(
    request: RequestFeatures,
    holder: ReplicaSnapshot,
    full_share: float | None,
    least_w: float | None,
) -> int:
    """Leading blocks of the request `holder` has: cached there, or in flight there when that
    match earns an allowance of at least `least_w` (None: in-flight prefixes are not held)."""
    cached = request.prefix_match.get(holder.name, 0)
    if least_w is None:
        return cached
    running = request.inflight_match.get(holder.name, 0)
    if running > cached and allowance(request, holder, running, full_share) >= least_w:
        return running
    return cached


def outheld(request: RequestFeatures, name: str) -> bool:
    """True when replica `name` holds none of the request's leading blocks (cached or in
    flight) and another has some cached: an affinity there would miss what is elsewhere."""
    # A session or prompt-cache entry outlives the cache it pointed at (evicted, or a user whose
    # prompts moved to another holder): followed, it turns a hit elsewhere into a miss. Only a
    # replica holding nothing yields: a partial match there (the index evicts tails first) may
    # still be the conversation's own history, and measured, yielding to any longer holder cost
    # hit rate (benchmarks/results/2026-12-06-stale-sessions).
    if request.prefix_match.get(name, 0) or request.inflight_match.get(name, 0):
        return False
    return any(request.prefix_match.values())


def undercut(loads: Sequence[float], i: int, slack: float, held_at: Callable[[int], int]) -> bool:
    """True when a replica carrying over `slack` fewer requests than replica i holds at least as
    much of the prompt (held_at(j): its leading blocks, at least 1): following an affinity to i
    would buy no cache. held_at is called only when such a lighter replica exists."""
    # A session on a prompt that shares only a system prompt with its earlier turns pins its
    # user to whichever holder it met first: a hot group splits by users, not by load.
    lighter = [j for j, lo in enumerate(loads) if lo + slack < loads[i]]
    if not lighter:  # the common case, and the hot path: no match is read
        return False
    floor = max(held_at(i), 1)
    return any(held_at(j) >= floor for j in lighter)


def load(r: ReplicaSnapshot) -> float:
    """Requests on the replica: the gateway's in-flight count, or vLLM's running + waiting.

    The larger of the two: in_flight sees a burst before the next scrape, running + waiting
    sees requests from other clients (other gateway replicas, direct users).
    """
    if r.running is None or r.waiting is None:
        return float(r.in_flight)
    return max(float(r.in_flight), r.running + r.waiting)
