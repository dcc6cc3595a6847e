"""A flush's writes: the pub/sub messages, the routing outcomes a process that starts later
bootstraps from, and the quota settles."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio.client import Pipeline

from gateway.config import CacheIndexConfig
from gateway.replicas.outlier import Ejection
from gateway.shared_state.config import SharedStateConfig
from gateway.shared_state.counts import VERSION_FIELD
from gateway.shared_state.mirror import Outcome, encode, outcome_of, split
from gateway.shared_state.scripts import SHAS, Keys
from routing.types import RequestFeatures

# Outcomes and block hashes per pub/sub message: a burst becomes a few messages, each well
# under Redis's pub/sub output-buffer limits (8 MB soft) for a subscriber that lags.
_PER_MESSAGE = 256
_BLOCKS_PER_MESSAGE = 16_384
# One quota settle waiting to be sent: (tenant, tokens_per_minute, reserved, used or None).
Settle = tuple[str, int, int, int | None]


def drain_outcomes(
    pending: deque[tuple[float, RequestFeatures, str]], max_blocks: int
) -> list[Outcome]:
    """Every routing outcome waiting (monotonic time, features, replica), oldest first."""
    out: list[Outcome] = []
    while pending:
        at, f, replica = pending.popleft()
        hashes = f.block_hashes
        out.append(outcome_of(int(at * 1e6), replica, f.prompt_hash, f.session, hashes, max_blocks))
    return out


def queue_messages(
    pipe: Pipeline,
    keys: Keys,
    process_id: str,
    outcomes: list[Outcome],
    ejections: Sequence[Ejection],
    scrapes: Sequence[Any],
    inflight: Sequence[Any] = (),
    counts: list[Any] | None = None,
    picks: Sequence[Any] = (),
) -> int:
    """The flush's pub/sub messages (ejections, scrape results, requests in flight, the
    in-flight counts and the picks ride in the first); returns how many were queued."""
    messages = split(outcomes, _PER_MESSAGE, _BLOCKS_PER_MESSAGE) or [[]] * bool(
        ejections or scrapes or inflight or counts or picks
    )
    for n, part in enumerate(messages):
        if n == 0:
            msg = encode(process_id, part, ejections, scrapes, inflight, counts, picks)
        else:
            msg = encode(process_id, part)
        pipe.publish(keys.channel, msg)
    return len(messages)


def queue_settles(pipe: Pipeline, keys: Keys, process_id: str, settles: Sequence[Settle]) -> None:
    """Each settled quota reservation, against its tenant's counters."""
    for tenant, tpm, reserved, used in settles:
        pipe.evalsha(
            SHAS["settle"],
            2,
            *keys.quota(tenant),
            process_id,
            tpm,
            reserved,
            "" if used is None else used,
        )


def queue_outcomes(
    pipe: Pipeline,
    keys: Keys,
    cfg: SharedStateConfig,
    cache: CacheIndexConfig,
    outcomes: Sequence[Outcome],
) -> int:
    """Tier-1 merges (last writer wins) and prefix placements; returns the merges queued."""
    now_us = int(time.time() * 1e6)
    merges = 0
    for tier, index, ttl, cap in (
        ("prompts", 2, cache.prompt_cache_ttl_s, cfg.max_prompts),
        ("sessions", 3, cache.session_ttl_s, cfg.max_sessions),
    ):
        # Entries older than the cache TTL are dropped too: no process would still use them.
        args: list[Any] = [now_us - int(ttl * 1e6), cap, int(ttl * 1000)]
        for o in outcomes:
            key = o[index]
            if key is not None:
                args += (str(key), str(o[0]), o[1])
        if len(args) > 3:
            pipe.evalsha(SHAS["merge"], 2, *keys.tier(tier), *args)
            merges += 1
    # One argument per outcome, its blocks joined: redis-py packs each argument in Python,
    # and a ZADD of two per block was most of a flush's CPU (2026-12-06-shared-state-cpu).
    placed: dict[str, list[Any]] = {}
    for version, replica, _, _, blocks in outcomes:
        if blocks:
            placed.setdefault(replica, []).extend((version, " ".join(map(str, blocks))))
    history_ms = int(cfg.prefix_ttl_s * 1000)
    for replica, args in placed.items():
        # The newest placements are kept: the oldest are what vLLM evicted first.
        pipe.evalsha(
            SHAS["place"],
            1,
            keys.prefixes(replica),
            cfg.max_blocks_per_replica,
            history_ms,
            *args,
        )
    return merges


def queue_beat(
    pipe: Pipeline,
    keys: Keys,
    process_id: str,
    lease_ms: int,
    version: int,
    counts: Mapping[str, int],
    held: dict[str, int],
) -> None:
    """The beat script: rewrite this process's in-flight lease (its counts' version, the
    counts, and quota slots it holds) and read the others' leases, in one round trip."""
    pipe.evalsha(
        SHAS["beat"],
        2 + len(held),
        keys.procs,
        keys.inflight(process_id),
        *(keys.quota(t)[1] for t in held),
        process_id,
        lease_ms,
        keys.inflight_base,
        1 + len(counts),
        VERSION_FIELD,
        version,
        *(x for pair in counts.items() for x in pair),
        *held.values(),
    )


def queue_goodbye(pipe: Pipeline, keys: Keys, process_id: str, counts_version: int) -> None:
    """A stopping process's last writes: out of the process set, its lease gone, and zero
    counts published so the others drop its in-flight load now, not at their next beat."""
    pipe.zrem(keys.procs, process_id)
    pipe.delete(keys.inflight(process_id))
    pipe.publish(keys.channel, encode(process_id, [], counts=[counts_version + 1, {}]))
