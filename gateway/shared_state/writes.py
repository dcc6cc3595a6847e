"""A flush's writes of routing outcomes: what a process that starts later bootstraps from."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio.client import Pipeline

from gateway.config import CacheIndexConfig
from gateway.shared_state.config import SharedStateConfig
from gateway.shared_state.mirror import Outcome
from gateway.shared_state.scripts import SHAS, Keys


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
    placed: dict[str, dict[str, int]] = {}
    for version, replica, _, _, blocks in outcomes:
        placed.setdefault(replica, {}).update(dict.fromkeys(map(str, blocks), version))
    history_ms = int(cfg.prefix_ttl_s * 1000)
    for replica, members in placed.items():
        if members:
            key = keys.prefixes(replica)
            pipe.zadd(key, members)
            # The newest placements are kept: the oldest are what vLLM evicted first.
            pipe.zremrangebyrank(key, 0, -cfg.max_blocks_per_replica - 1)
            pipe.pexpire(key, history_ms)
    return merges
