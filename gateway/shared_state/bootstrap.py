"""A process that starts, or comes back from an outage, reads what Redis holds into its tiers."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from gateway.shared_state.mirror import Mirror
from gateway.shared_state.scripts import Keys

# Entries applied between two yields to the event loop: requests keep flowing meanwhile.
_CHUNK = 4096


async def load(redis: Redis, keys: Keys, mirror: Mirror, replicas: list[str]) -> None:
    """Tier-1 maps and each replica's prefix placements, in one pipelined round trip."""
    pipe = redis.pipeline(transaction=False)
    for tier in ("prompts", "sessions"):
        values, versions = keys.tier(tier)
        pipe.hgetall(values)
        pipe.zrange(versions, 0, -1, withscores=True)
    for replica in replicas:
        pipe.zrange(keys.prefixes(replica), 0, -1)
    results = await pipe.execute()
    for i, tier in enumerate(("prompts", "sessions")):
        values, versions = results[2 * i], results[2 * i + 1]
        triples = []
        for field, version in versions:
            replica = values.get(field)
            if replica is not None:
                triples.append((int(field), replica.decode(), int(version)))
        for start in range(0, len(triples), _CHUNK):
            mirror.apply_map(tier, triples[start : start + _CHUNK])
            await asyncio.sleep(0)
    for replica, members in zip(replicas, results[4:], strict=True):
        # Oldest first, chunk by chunk: the newest end up the most recent in the LRU.
        for start in range(0, len(members), _CHUNK):
            mirror.apply_placements(replica, [int(m) for m in members[start : start + _CHUNK]])
            await asyncio.sleep(0)
