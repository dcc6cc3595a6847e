"""Tier 3: per-bucket admission queues, by prompt tokens, for when every replica is saturated.

Each (model, bucket) holds one FIFO per tenant and priority class. Dispatch order (pure
policy; the gateway waits on futures and calls `pop` when a slot frees):
1. A class and a bucket. Aging first: if the oldest waiting ticket has waited `age_first_s`
   (default half of `max_wait_s`), its class and bucket go next, so nothing is starved by a
   busier class or bucket. Otherwise the most urgent class waiting (lowest number: P0 before
   P1 before P2, strictly), and within it stride scheduling across its non-empty buckets:
   bucket i has weight r**i with r = long_share / (1 - long_share), and each dispatch
   advances that bucket's pass by 1 / weight; the lowest pass wins (ties: shorter bucket).
   With two backlogged buckets the longer one gets `long_share` of dispatches (0.2 -> one in
   five), so short requests are not stuck behind long ones and long ones are never starved.
   A bucket that was empty rejoins one stride past the current pass: idle time banks no credit.
2. A tenant, within that class and bucket, by weighted fair queueing (stride by weight): each
   dispatch advances the tenant's pass in the bucket by 1 / weight and the lowest pass wins
   (ties: the oldest head). Two backlogged tenants of weights 2 and 1 get 2:1 of the
   dispatches, and a tenant joining the bucket starts one stride past the last dispatched
   pass, so a flood of one tenant delays another's request by about one dispatch per tenant.
   Aging picks the class and bucket, not the tenant: an aged flood cannot push a fresh
   request of another tenant behind its whole backlog.
3. Within the tenant's queue, oldest first across models.

`max_depth` bounds each tenant's tickets per (model, bucket): one tenant cannot fill the queue
for the others. The caller names the tenants (a bounded set: the gateway's configured
tenants), and its weights and classes. Time is always passed in: no clock in here.

A request arrives with its bucket already named (`bucket_of`, once, when its features are
computed), so the queue and everything that reports per bucket agree on one placement.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

from cache_index.errors import CacheIndexError

_RATE_SAMPLES = 64

# (model, bucket index, priority class, tenant): one FIFO queue.
_Key = tuple[str, int, int, str]
_T = TypeVar("_T", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Ticket:
    """One waiting request."""

    # Unique among waiting tickets: the caller's own key, never an id a client chose.
    item_id: str
    model: str
    bucket: str
    enqueued_at: float
    deadline: float
    order: int
    tenant: str = ""
    # Lower goes first (the gateway's P0..P2).
    priority: int = 0


class QueueFull(CacheIndexError):
    """The tenant's (model, bucket) queue is at `max_depth`: answer 429 with Retry-After."""

    def __init__(self, model: str, bucket: str, retry_after_s: float, tenant: str = "") -> None:
        who = f" of tenant {tenant!r}" if tenant else ""
        super().__init__(f"admission queue{who} full for model {model!r}, bucket {bucket}")
        self.model = model
        self.bucket = bucket
        self.tenant = tenant
        self.retry_after_s = retry_after_s


def bucket_names(limits: Sequence[int]) -> tuple[str, ...]:
    """Names for token limits: (128, 512) -> ("le128", "le512", "gt512"); () -> ("all",)."""
    if not limits:
        return ("all",)
    return (*(f"le{limit}" for limit in limits), f"gt{limits[-1]}")


def bucket_of(limits: Sequence[int], tokens: int) -> str:
    """The bucket a prompt of `tokens` tokens falls into under increasing, inclusive `limits`."""
    return bucket_names(limits)[bisect_left(limits, tokens)]


def _bump(counts: dict[_T, int], key: _T, by: int) -> None:
    left = counts.get(key, 0) + by
    if left:
        counts[key] = left
    else:
        del counts[key]


class AdmissionQueue:
    """Bounded per-(model, bucket, tenant, class) FIFO queues with a fair, starvation-free pop.

    Args: buckets: increasing upper token limits (a last unbounded bucket is added).
    max_depth: waiting tickets per tenant and (model, bucket). max_wait_s: deadline after push.
    long_share: dispatch share of the next longer bucket when both are backlogged (0-0.5].
    age_first_s: a ticket waiting this long gets its class and bucket served first
    (default max_wait_s / 2).
    """

    def __init__(
        self,
        buckets: Sequence[int] = (128, 512),
        max_depth: int = 1024,
        max_wait_s: float = 30.0,
        long_share: float = 0.2,
        age_first_s: float | None = None,
    ) -> None:
        limits = tuple(buckets)
        if any(b <= 0 for b in limits) or any(a >= b for a, b in pairwise(limits)):
            raise CacheIndexError(f"bucket limits must be positive and increasing: {limits}")
        if max_depth <= 0 or max_wait_s <= 0 or not 0 < long_share <= 0.5:
            raise CacheIndexError("need max_depth > 0, max_wait_s > 0, 0 < long_share <= 0.5")
        self.limits = limits
        self.names = bucket_names(limits)
        self._slot = {name: i for i, name in enumerate(self.names)}
        self.max_depth = max_depth
        self.max_wait_s = max_wait_s
        self.age_first_s = max_wait_s / 2 if age_first_s is None else age_first_s
        ratio = long_share / (1.0 - long_share)
        self._stride = [1.0 / ratio**i for i in range(len(self.names))]
        self._pass = [0.0] * len(self.names)
        self._vtime = 0.0
        self._bucket_depth = [0] * len(self.names)
        # Removed tickets stay in their deque until they reach its head (lazy deletion).
        self._queues: dict[_Key, deque[Ticket]] = {}
        self._depth: dict[_Key, int] = {}
        # Live counts by what is bounded or reported: (model, bucket, tenant) for max_depth,
        # (model, bucket) for depth(), model for waiting_for(), tenant for tenant_depth().
        self._tenant_depth: dict[tuple[str, int, str], int] = {}
        self._mb_depth: dict[tuple[str, int], int] = {}
        self._model_depth: dict[str, int] = {}
        self._by_tenant: dict[str, int] = {}
        # Fair queueing per bucket: each tenant's pass and stride (1 / weight) while it has
        # tickets there, and the pass of the bucket's last dispatch (its virtual time).
        self._tpass: dict[tuple[int, str], float] = {}
        self._tstride: dict[tuple[int, str], float] = {}
        self._in_bucket: dict[tuple[int, str], int] = {}
        self._tvtime = [0.0] * len(self.names)
        self._live: dict[str, Ticket] = {}
        self._models: set[str] = set()
        self._pops: deque[float] = deque(maxlen=_RATE_SAMPLES)
        self._order = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._live

    def push(
        self,
        item_id: str,
        model: str,
        bucket: str,
        now: float,
        since: float | None = None,
        *,
        tenant: str = "",
        weight: float = 1.0,
        priority: int = 0,
    ) -> Ticket:
        """Queue a request in its bucket (a name of `names`); QueueFull when its queue is full.

        `since`: when the request first queued, for one sent back again (it keeps its age and
        deadline). `weight`: the tenant's fair share (> 0); the latest push's counts.
        """
        if item_id in self._live:
            raise CacheIndexError(f"ticket {item_id!r} is already queued")
        b = self._slot.get(bucket)
        if b is None:
            raise CacheIndexError(f"unknown bucket {bucket!r} (buckets: {', '.join(self.names)})")
        if not weight > 0:
            raise CacheIndexError(f"tenant weight must be > 0, got {weight}")
        if self._tenant_depth.get((model, b, tenant), 0) >= self.max_depth:
            raise QueueFull(model, self.names[b], self.retry_after_s(now), tenant)
        start = now if since is None else since
        ticket = Ticket(
            item_id, model, bucket, start, start + self.max_wait_s, self._order, tenant, priority
        )
        self._order += 1
        self._join(ticket, b, weight)
        self._queues.setdefault((model, b, priority, tenant), deque()).append(ticket)
        return ticket

    def requeue(self, ticket: Ticket, weight: float = 1.0) -> None:
        """Put back a popped ticket that found no room: at its queue's head, its turn refunded.

        It keeps its place, age and deadline, and may pass `max_depth` (it had a place).
        """
        if ticket.item_id in self._live:
            raise CacheIndexError(f"ticket {ticket.item_id!r} is already queued")
        b = self._slot[ticket.bucket]
        bt = (b, ticket.tenant)
        refund = bt in self._tpass
        self._join(ticket, b, weight)
        # Undo what its pop charged: the bucket's and the tenant's stride.
        self._pass[b] -= self._stride[b]
        self._tpass[bt] = self._tpass[bt] - self._tstride[bt] if refund else self._tvtime[b]
        if self._pops:
            self._pops.pop()
        key = (ticket.model, b, ticket.priority, ticket.tenant)
        self._queues.setdefault(key, deque()).appendleft(ticket)

    def _join(self, ticket: Ticket, b: int, weight: float) -> None:
        """Count a ticket in; a bucket or tenant that had none starts one stride on."""
        if self._bucket_depth[b] == 0:
            # A (re)joining bucket pays one stride first: no credit banked while idle, and a
            # long bucket does not win the first dispatch just because every pass starts equal.
            self._pass[b] = max(self._pass[b], self._vtime + self._stride[b])
        bt = (b, ticket.tenant)
        stride = 1.0 / weight
        self._tstride[bt] = stride
        if bt not in self._tpass:
            self._tpass[bt] = self._tvtime[b] + stride
        self._bump(ticket, b, 1)
        self._live[ticket.item_id] = ticket
        self._models.add(ticket.model)

    def _bump(self, ticket: Ticket, b: int, by: int) -> None:
        model, tenant = ticket.model, ticket.tenant
        _bump(self._depth, (model, b, ticket.priority, tenant), by)
        _bump(self._tenant_depth, (model, b, tenant), by)
        _bump(self._mb_depth, (model, b), by)
        _bump(self._model_depth, model, by)
        _bump(self._by_tenant, tenant, by)
        self._bucket_depth[b] += by
        bt = (b, tenant)
        _bump(self._in_bucket, bt, by)
        if bt not in self._in_bucket:
            # Nothing of the tenant left in the bucket: bounded state, and no debt kept
            # beyond what the rejoin rule charges anyway.
            del self._tpass[bt], self._tstride[bt]

    def _head(self, key: _Key) -> Ticket | None:
        queue = self._queues.get(key)
        while queue:
            ticket = queue[0]
            if self._live.get(ticket.item_id) is ticket:
                return ticket
            queue.popleft()
        return None

    def _take(self, key: _Key) -> Ticket:
        ticket = self._queues[key].popleft()
        self._forget(key, ticket)
        return ticket

    def _forget(self, key: _Key, ticket: Ticket) -> None:
        del self._live[ticket.item_id]
        self._bump(ticket, key[1], -1)
        if key not in self._depth:
            del self._queues[key]

    def pop(self, now: float, model: str | None = None) -> Ticket | None:
        """The next ticket to dispatch (of `model` only, when given), or None if none waits."""
        heads: list[tuple[_Key, Ticket]] = []
        for key in list(self._depth):
            if model is None or key[0] == model:
                head = self._head(key)
                if head is not None:
                    heads.append((key, head))
        if not heads:
            return None
        oldest_key, oldest = min(heads, key=lambda kh: kh[1].order)
        if now - oldest.enqueued_at >= self.age_first_s:
            b, cls = oldest_key[1], oldest_key[2]
        else:
            cls = min(k[2] for k, _ in heads)
            b = min({k[1] for k, _ in heads if k[2] == cls}, key=lambda i: (self._pass[i], i))
        # Each tenant's oldest head in the chosen class and bucket.
        first: dict[str, tuple[_Key, Ticket]] = {}
        for k, h in heads:
            if k[1] == b and k[2] == cls:
                seen = first.get(k[3])
                if seen is None or h.order < seen[1].order:
                    first[k[3]] = (k, h)
        tpass = self._tpass
        tenant = min(first, key=lambda t: (tpass[(b, t)], first[t][1].order))
        self._vtime = self._pass[b]
        self._pass[b] += self._stride[b]
        bt = (b, tenant)
        self._tvtime[b] = tpass[bt]
        tpass[bt] += self._tstride[bt]
        self._pops.append(now)
        return self._take(first[tenant][0])

    def expire(self, now: float) -> list[Ticket]:
        """Remove and return every ticket whose deadline has passed (answer each with 429)."""
        out: list[Ticket] = []
        for key in list(self._depth):
            # One max_wait_s for all, so deadlines rise along each FIFO queue.
            head = self._head(key)
            while head is not None and head.deadline <= now:
                out.append(self._take(key))
                head = self._head(key) if key in self._depth else None
        out.sort(key=lambda t: t.order)
        return out

    def remove(self, item_id: str) -> bool:
        """Drop a ticket whose client went away; False if it was not waiting."""
        ticket = self._live.get(item_id)
        if ticket is None:
            return False
        key = (ticket.model, self._slot[ticket.bucket], ticket.priority, ticket.tenant)
        self._forget(key, ticket)
        queue = self._queues.get(key)
        # Bound dead entries: rebuild the deque once they outnumber the live ones.
        if queue is not None and len(queue) > 2 * self._depth[key] + 16:
            live = self._live
            self._queues[key] = deque(t for t in queue if live.get(t.item_id) is t)
        return True

    def waiting_for(self, model: str) -> int:
        """Tickets of `model` waiting, all buckets and tenants together."""
        return self._model_depth.get(model, 0)

    def depth(self) -> dict[tuple[str, str], int]:
        """Waiting tickets per (model, bucket name), zeros included for every model seen."""
        return {
            (model, name): self._mb_depth.get((model, b), 0)
            for model in sorted(self._models)
            for b, name in enumerate(self.names)
        }

    def tenant_depth(self) -> dict[str, int]:
        """Waiting tickets per tenant, all models and buckets together (waiting tenants only)."""
        return dict(self._by_tenant)

    def retry_after_s(self, now: float) -> float:
        """Seconds until the queue has likely drained: waiting / recent dispatch rate."""
        recent = [t for t in self._pops if now - t <= self.max_wait_s]
        if not recent or now <= recent[0]:
            return self.max_wait_s
        rate = len(recent) / (now - recent[0])
        return min(self.max_wait_s, max(1.0, (len(self._live) + 1) / rate))
