"""Tenant quotas counted in Redis: one limit for every gateway process, not one per process.

A reserve is one atomic script (slots, requests and tokens per minute at once), the only Redis
wait on a request's path, bounded by `op_timeout_s`. On a timeout, or while Redis is down,
the request is reserved in this process's `LocalQuotaStore` instead: limits then hold per
process (N processes admit up to N x a limit) until Redis answers again. Settles are queued
and sent with the next flush; this process's slot counts are rewritten at every heartbeat,
so a settle lost in an outage (or a reserve cancelled after it ran) heals within one beat, and
a dead process's slots are freed once its lease runs out.
"""

from __future__ import annotations

import asyncio
import time

from gateway.proxy.quota import Limits, LocalQuotaStore, Refusal
from gateway.shared_state.link import FAILURES
from gateway.shared_state.scripts import SHAS
from gateway.shared_state.state import SharedState


class RedisQuotaStore:
    """`QuotaStore` over Redis, falling back to this process's counters."""

    def __init__(self, shared: SharedState) -> None:
        self._shared = shared
        self.local = LocalQuotaStore()
        # Tenant -> reservations this process holds in Redis (reported at every heartbeat).
        self._held: dict[str, int] = {}
        # The longest a reserve waited on Redis (seconds), and how many fell back.
        self.max_wait_s = 0.0
        self.fallbacks = 0
        shared.quota_held = lambda: self._held

    async def reserve(self, tenant: str, limits: Limits, tokens: int, now: float) -> Refusal | None:
        shared = self._shared
        if not shared.up:
            self.fallbacks += 1
            return self.local.reserve_now(tenant, limits, tokens, now)
        keys = shared.keys
        lease_ms = int(shared.cfg.lease_ttl_s * 1000)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(shared.cfg.op_timeout_s):
                answer = await shared.redis.evalsha(
                    SHAS["reserve"],
                    3,
                    *keys.quota(tenant),
                    keys.procs,
                    shared.process_id,
                    limits.max_concurrent,
                    limits.requests_per_minute,
                    limits.tokens_per_minute,
                    tokens,
                    lease_ms,
                )
        except FAILURES as exc:
            shared.failed("quota reserve", exc)
            self.fallbacks += 1
            return self.local.reserve_now(tenant, limits, tokens, now)
        finally:
            self.max_wait_s = max(self.max_wait_s, time.perf_counter() - started)
        shared.answered()
        if answer is None:
            self._held[tenant] = self._held.get(tenant, 0) + 1
            return None
        limit, retry = answer[0].decode(), float(answer[1])
        if limit == "max_concurrent":
            return Refusal("max_concurrent", retry)
        if limit == "requests_per_minute":
            return Refusal("requests_per_minute", retry)
        return Refusal("tokens_per_minute", retry)

    def settle(
        self, tenant: str, limits: Limits, reserved: int, used: int | None, now: float
    ) -> None:
        # Which store holds the reservation is not passed in: Redis while this process holds
        # any there (they only mix across an outage's edges, where the counts heal anyway).
        held = self._held.get(tenant, 0)
        if held <= 0:
            self.local.settle(tenant, limits, reserved, used, now)
            return
        # Kept at 0, not deleted: the next heartbeat then clears this process's slots there.
        self._held[tenant] = held - 1
        self._shared.queue_settle((tenant, limits.tokens_per_minute, reserved, used))
