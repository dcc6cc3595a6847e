"""Tier 3 in the request path: wait in per-bucket, per-tenant queues while replicas are full."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cache_index.admission_queue import AdmissionQueue, QueueFull, Ticket
from gateway.config import AdmissionConfig
from gateway.errors import GatewayError
from routing.types import Decision, RequestFeatures, Saturated


class RateLimited(GatewayError):
    """The admission queue is full, or the wait passed its deadline: 429 with Retry-After."""

    status = 429


@dataclass(frozen=True, slots=True)
class Lane:
    """Where a request waits: its tenant's queue, the tenant's weight, its priority class."""

    tenant: str = ""
    weight: float = 1.0
    # 0 (P0) is served first.
    priority: int = 1


DEFAULT_LANE = Lane()


class Admission:
    """Parks requests that only saturated replicas could take; wakes them as capacity frees.

    Wake-ups come from every finished request and every metrics scrape. A woken request that
    routes successfully wakes the next one, so a freed batch drains at once; one that finds
    every replica still saturated goes back to the head of its queue, its turn refunded.
    """

    def __init__(self, cfg: AdmissionConfig) -> None:
        self.queue = AdmissionQueue(
            buckets=cfg.buckets,
            max_depth=cfg.max_depth,
            max_wait_s=cfg.max_wait_s,
            long_share=cfg.long_share,
        )
        self._waiters: dict[str, asyncio.Future[Ticket]] = {}
        self._tickets = itertools.count()
        self.admitted_after_wait = 0
        self.rejected_full = 0
        self.rejected_timeout = 0

    def waiting(self, model: str) -> bool:
        return self.queue.waiting_for(model) > 0

    def notify(self) -> None:
        """Capacity may have freed: wake the next request in dispatch order."""
        now = time.monotonic()
        while True:
            ticket = self.queue.pop(now)
            if ticket is None:
                return
            waiter = self._waiters.pop(ticket.item_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(ticket)
                return

    def _limited(self, message: str) -> RateLimited:
        retry = math.ceil(self.queue.retry_after_s(time.monotonic()))
        return RateLimited(message, retry_after_s=retry)

    async def admit(
        self, features: RequestFeatures, route: Callable[[], Decision], lane: Lane = DEFAULT_LANE
    ) -> tuple[Decision, bool]:
        """Route now, or queue in `lane` until a replica has room; returns (decision, waited)."""
        model = features.model
        # Nobody jumps the line: with requests of this model already waiting, queue behind them
        # (the queue's order then puts a better class or a fairer tenant first).
        if not self.waiting(model):
            try:
                return route(), False
            except Saturated:
                pass  # wait below; any other NoReplicaError is the caller's to answer
        # Keyed by an id of our own: two clients may well send the same x-request-id.
        item = str(next(self._tickets))
        try:
            # Named by Affinity from the same [admission].buckets as this queue's.
            ticket = self.queue.push(
                item,
                model,
                features.bucket,
                time.monotonic(),
                tenant=lane.tenant,
                weight=lane.weight,
                priority=lane.priority,
            )
        except QueueFull as full:
            self.rejected_full += 1
            whose = "of this tenant's requests" if full.tenant else "requests"
            raise RateLimited(
                f"Too many {whose} are waiting for this model; retry later.",
                retry_after_s=math.ceil(full.retry_after_s),
            ) from None
        loop = asyncio.get_running_loop()
        while True:
            waiter: asyncio.Future[Ticket] = loop.create_future()
            self._waiters[item] = waiter
            try:
                async with asyncio.timeout(max(0.0, ticket.deadline - time.monotonic())):
                    ticket = await waiter
            except BaseException as exc:
                # Gone for good (timeout, client left): not waiting now.
                self._waiters.pop(item, None)
                if not self.queue.remove(item) and waiter.done() and not waiter.cancelled():
                    self.notify()  # woken just as it gave up: the slot goes to the next in line
                if not isinstance(exc, TimeoutError):
                    raise
                self.rejected_timeout += 1
                raise self._limited(
                    "Every replica serving this model stayed saturated; retry later."
                ) from None
            try:
                decision = route()
            except Saturated:
                self.queue.requeue(ticket, lane.weight)
                continue
            self.admitted_after_wait += 1
            self.notify()  # the next in line may fit too
            return decision, True
