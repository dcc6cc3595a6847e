"""Tier 3: per-bucket admission queues, by prompt tokens, for when every replica is saturated.

Dispatch order (pure policy; the gateway waits on futures and calls `pop` when a slot frees):
1. Aging: if the oldest waiting ticket has waited `age_first_s` (default half of
   `max_wait_s`), it goes first, so nothing waits past that while others are dispatched.
2. Otherwise stride scheduling across non-empty buckets: bucket i has weight r**i with
   r = long_share / (1 - long_share), and each dispatch advances that bucket's pass by
   1 / weight; the lowest pass wins (ties: shorter bucket). With two backlogged buckets the
   longer one gets `long_share` of dispatches (0.2 -> one in five), so short requests are
   not stuck behind long ones and long ones are never starved. A bucket that was empty
   rejoins one stride past the current pass, so idle time banks no credit.
Within a bucket, tickets go out oldest first across models.

A request arrives with its bucket already named (`bucket_of`, once, when its features are
computed), so the queue and everything that reports per bucket agree on one placement.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from cache_index.errors import CacheIndexError

_RATE_SAMPLES = 64


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


class QueueFull(CacheIndexError):
    """The (model, bucket) queue is at `max_depth`: answer 429 with Retry-After."""

    def __init__(self, model: str, bucket: str, retry_after_s: float) -> None:
        super().__init__(f"admission queue full for model {model!r}, bucket {bucket}")
        self.model = model
        self.bucket = bucket
        self.retry_after_s = retry_after_s


def bucket_names(limits: Sequence[int]) -> tuple[str, ...]:
    """Names for token limits: (128, 512) -> ("le128", "le512", "gt512"); () -> ("all",)."""
    if not limits:
        return ("all",)
    return (*(f"le{limit}" for limit in limits), f"gt{limits[-1]}")


def bucket_of(limits: Sequence[int], tokens: int) -> str:
    """The bucket a prompt of `tokens` tokens falls into under increasing, inclusive `limits`."""
    return bucket_names(limits)[bisect_left(limits, tokens)]


class AdmissionQueue:
    """Bounded per-(model, bucket) FIFO queues with a short-first, starvation-free dispatch.

    Args: buckets: increasing upper token limits (a last unbounded bucket is added).
    max_depth: waiting tickets per (model, bucket). max_wait_s: deadline after push.
    long_share: dispatch share of the next longer bucket when both are backlogged (0-0.5].
    age_first_s: a ticket waiting this long goes first (default max_wait_s / 2).
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
        self._queues: dict[tuple[str, int], deque[Ticket]] = {}
        self._depth: dict[tuple[str, int], int] = {}
        self._live: dict[str, Ticket] = {}
        self._models: set[str] = set()
        self._pops: deque[float] = deque(maxlen=_RATE_SAMPLES)
        self._order = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._live

    def push(
        self, item_id: str, model: str, bucket: str, now: float, since: float | None = None
    ) -> Ticket:
        """Queue a request in its bucket (a name of `names`); QueueFull when that queue is full.

        `since`: when the request first queued, for one woken but sent back again (it keeps
        its age and deadline).
        """
        if item_id in self._live:
            raise CacheIndexError(f"ticket {item_id!r} is already queued")
        b = self._slot.get(bucket)
        if b is None:
            raise CacheIndexError(f"unknown bucket {bucket!r} (buckets: {', '.join(self.names)})")
        key = (model, b)
        if self._depth.get(key, 0) >= self.max_depth:
            raise QueueFull(model, self.names[b], self.retry_after_s(now))
        if self._bucket_depth[b] == 0:
            # A (re)joining bucket pays one stride first: no credit banked while idle, and a
            # long bucket does not win the first dispatch just because every pass starts equal.
            self._pass[b] = max(self._pass[b], self._vtime + self._stride[b])
        start = now if since is None else since
        deadline = start + self.max_wait_s
        ticket = Ticket(item_id, model, bucket, start, deadline, self._order)
        self._order += 1
        self._queues.setdefault(key, deque()).append(ticket)
        self._depth[key] = self._depth.get(key, 0) + 1
        self._bucket_depth[b] += 1
        self._live[item_id] = ticket
        self._models.add(model)
        return ticket

    def _head(self, key: tuple[str, int]) -> Ticket | None:
        queue = self._queues.get(key)
        while queue:
            ticket = queue[0]
            if self._live.get(ticket.item_id) is ticket:
                return ticket
            queue.popleft()
        return None

    def _take(self, key: tuple[str, int]) -> Ticket:
        ticket = self._queues[key].popleft()
        self._forget(key, ticket)
        return ticket

    def _forget(self, key: tuple[str, int], ticket: Ticket) -> None:
        del self._live[ticket.item_id]
        self._bucket_depth[key[1]] -= 1
        left = self._depth[key] - 1
        if left:
            self._depth[key] = left
        else:
            del self._depth[key]
            del self._queues[key]

    def pop(self, now: float, model: str | None = None) -> Ticket | None:
        """The next ticket to dispatch (of `model` only, when given), or None if none waits."""
        heads: list[tuple[tuple[str, int], Ticket]] = []
        for key in list(self._depth):
            if model is None or key[0] == model:
                head = self._head(key)
                if head is not None:
                    heads.append((key, head))
        if not heads:
            return None
        key, oldest = min(heads, key=lambda kh: kh[1].order)
        if now - oldest.enqueued_at < self.age_first_s:
            b = min({k[1] for k, _ in heads}, key=lambda i: (self._pass[i], i))
            key, _ = min(((k, h) for k, h in heads if k[1] == b), key=lambda kh: kh[1].order)
        b = key[1]
        self._vtime = self._pass[b]
        self._pass[b] += self._stride[b]
        self._pops.append(now)
        return self._take(key)

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
        key = (ticket.model, self._slot[ticket.bucket])
        self._forget(key, ticket)
        queue = self._queues.get(key)
        # Bound dead entries: rebuild the deque once they outnumber the live ones.
        if queue is not None and len(queue) > 2 * self._depth[key] + 16:
            live = self._live
            self._queues[key] = deque(t for t in queue if live.get(t.item_id) is t)
        return True

    def waiting_for(self, model: str) -> int:
        """Tickets of `model` waiting, all buckets together."""
        return sum(d for (m, _), d in self._depth.items() if m == model)

    def depth(self) -> dict[tuple[str, str], int]:
        """Waiting tickets per (model, bucket name), zeros included for every model seen."""
        return {
            (model, name): self._depth.get((model, b), 0)
            for model in sorted(self._models)
            for b, name in enumerate(self.names)
        }

    def retry_after_s(self, now: float) -> float:
        """Seconds until the queue has likely drained: waiting / recent dispatch rate."""
        recent = [t for t in self._pops if now - t <= self.max_wait_s]
        if not recent or now <= recent[0]:
            return self.max_wait_s
        rate = len(recent) / (now - recent[0])
        return min(self.max_wait_s, max(1.0, (len(self._live) + 1) / rate))
