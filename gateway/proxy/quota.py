"""Per-tenant quotas: concurrency, requests and tokens per minute, reserved then settled.

A request reserves at arrival: one concurrency slot, one request, and prompt + max_tokens
tokens (every reservation in flight counts, so a burst cannot overshoot). When it ends it
settles: the slot frees and its tokens are replaced by what its answer's `usage` says
(none reported: the reservation stands; nothing sent: refunded). Per-minute budgets are
token buckets holding a minute's worth, refilled continuously.

The counters sit behind `QuotaStore`. `LocalQuotaStore` keeps them in this process; once
gateway processes share state (issue 16) a Redis store implements the same contract (an
atomic reserve script per tenant; settle queued and sent in the background), so quotas hold
across every process instead of per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Limit = Literal["max_concurrent", "requests_per_minute", "tokens_per_minute"]
# A refusal for concurrency cannot know when a slot frees: ask again after this long.
_CONCURRENCY_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's quotas; 0 = unlimited."""

    max_concurrent: int = 0
    requests_per_minute: int = 0
    tokens_per_minute: int = 0

    @property
    def any(self) -> bool:
        return bool(self.max_concurrent or self.requests_per_minute or self.tokens_per_minute)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The limit a reservation would pass, and the seconds until enough of it frees."""

    limit: Limit
    retry_after_s: float


class QuotaStore(Protocol):
    """The tenants' counters: in this process, or shared by every gateway process."""

    async def reserve(self, tenant: str, limits: Limits, tokens: int, now: float) -> Refusal | None:
        """Take a slot, a request and `tokens` at once, or nothing and say which limit refused."""
        ...

    def settle(
        self, tenant: str, limits: Limits, reserved: int, used: int | None, now: float
    ) -> None:
        """Free the slot; charge `used` tokens instead of `reserved` (None: keep `reserved`).

        Called on the event loop as a request ends: it must not block (a shared store queues
        the write).
        """
        ...


class _Budget:
    """A token bucket of `capacity` per minute: full at start, refilled continuously."""

    __slots__ = ("at", "level")

    def __init__(self, capacity: int, now: float) -> None:
        self.level = float(capacity)
        self.at = now

    def refill(self, capacity: int, now: float) -> None:
        if now > self.at:
            self.level = min(float(capacity), self.level + (now - self.at) * capacity / 60.0)
            self.at = now

    def shortfall_s(self, cost: float, capacity: int) -> float:
        """Seconds until `cost` fits (0: it fits now)."""
        missing = cost - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / capacity


class _TenantCounters:
    __slots__ = ("concurrent", "requests", "tokens")

    def __init__(self, limits: Limits, now: float) -> None:
        self.concurrent = 0
        self.requests = _Budget(limits.requests_per_minute, now)
        self.tokens = _Budget(limits.tokens_per_minute, now)


class LocalQuotaStore:
    """Counters in this process (one gateway process, or quotas per process)."""

    def __init__(self) -> None:
        # One entry per tenant that has limits: the configured tenants, a bounded set.
        self._tenants: dict[str, _TenantCounters] = {}

    def counters(self, tenant: str, limits: Limits, now: float) -> _TenantCounters:
        found = self._tenants.get(tenant)
        if found is None:
            found = self._tenants[tenant] = _TenantCounters(limits, now)
        return found

    def in_flight(self, tenant: str) -> int:
        """The tenant's reservations not yet settled."""
        found = self._tenants.get(tenant)
        return found.concurrent if found is not None else 0

    async def reserve(self, tenant: str, limits: Limits, tokens: int, now: float) -> Refusal | None:
        return self.reserve_now(tenant, limits, tokens, now)

    def reserve_now(self, tenant: str, limits: Limits, tokens: int, now: float) -> Refusal | None:
        """`reserve` without the await: this store never waits."""
        c = self.counters(tenant, limits, now)
        if limits.max_concurrent and c.concurrent >= limits.max_concurrent:
            return Refusal("max_concurrent", _CONCURRENCY_RETRY_S)
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        if rpm:
            c.requests.refill(rpm, now)
            wait = c.requests.shortfall_s(1.0, rpm)
            if wait:
                return Refusal("requests_per_minute", wait)
        # More than a whole minute's budget still runs, once the budget is full.
        cost = min(tokens, tpm)
        if tpm:
            c.tokens.refill(tpm, now)
            wait = c.tokens.shortfall_s(cost, tpm)
            if wait:
                return Refusal("tokens_per_minute", wait)
        c.concurrent += 1
        if rpm:
            c.requests.level -= 1.0
        if tpm:
            c.tokens.level -= cost
        return None

    def settle(
        self, tenant: str, limits: Limits, reserved: int, used: int | None, now: float
    ) -> None:
        c = self.counters(tenant, limits, now)
        c.concurrent = max(0, c.concurrent - 1)
        tpm = limits.tokens_per_minute
        if tpm and used is not None:
            c.tokens.refill(tpm, now)
            # More used than reserved leaves the budget in debt: later requests wait it out.
            c.tokens.level = min(float(tpm), c.tokens.level + min(reserved, tpm) - used)
