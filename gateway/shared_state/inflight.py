"""Prefixes in flight shared between processes: a new prefix's second request follows its first
even when another process routed the first.

One process follows the prefixes of its own requests in flight from the moment it picks
(cache_index/inflight_prefixes.py); the others learn of that placement only from the routing
outcome, published at the request's first byte, a TTFT later. Until then they place the same new
prefix by load, on another replica, and the group stays split between the processes' picks
(benchmarks/results/2026-12-04-shared-state-ttft). Here each start and end of this process's
requests in flight rides in the next flush ("f" of the message); the others keep them beside
their own, under keys of their own, until the end arrives or `lease_ttl_s` has passed (a
process that died sends no end; past a first byte the routing outcome holds the placement).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

from cache_index.inflight_prefixes import InflightPrefixes

# Events one flush carries (the rest wait for the next): a message stays small after an outage.
PER_FLUSH = 256
_E = TypeVar("_E")
# A start on the wire: [key, replica, block hashes]; an end: [key].
Event = list[Any]


class SharedInflight(InflightPrefixes):
    """This process's prefixes in flight (told to the others) and theirs, in one map."""

    __slots__ = (
        "_events",
        "_max_blocks",
        "_next_key",
        "_remote",
        "_told",
        "_ttl_s",
        "_wake",
        "applied",
        "sharing",
        "told",
    )

    def __init__(
        self, max_requests: int, ttl_s: float, max_blocks: int, wake: Callable[[], None]
    ) -> None:
        super().__init__(max_requests)
        self._ttl_s = ttl_s
        self._max_blocks = max_blocks
        self._wake = wake
        # Set by the shared state: starts are told only while the link is up.
        self.sharing = False
        self._events: deque[Event] = deque(maxlen=max_requests)
        # This process's keys told to the others as started (their end is told too).
        self._told: set[int] = set()
        # (origin, its key) -> (our key for it, monotonic time it started), oldest first.
        self._remote: dict[tuple[str, int], tuple[int, float]] = {}
        # Ours for the others' entries: negative, where id()-based local keys never are.
        self._next_key = -1
        # Counters for the metrics: starts told to the others, and theirs applied here.
        self.told = 0
        self.applied = 0

    def add(self, key: int, replica: str, block_hashes: tuple[int, ...]) -> None:
        """This process's request `key` runs on `replica`: kept here and told to the others."""
        super().add(key, replica, block_hashes)
        if self.sharing and block_hashes and key >= 0:
            self._told.add(key)
            self.told += 1
            self._events.append([key, replica, list(block_hashes[: self._max_blocks])])
            self._wake()

    def remove(self, key: int) -> None:
        """Request `key` ended here; the others are told if they were told it started."""
        super().remove(key)
        if key in self._told:
            self._told.discard(key)
            self._events.append([key])
            self._wake()

    def drain(self) -> list[Event]:
        """Starts and ends to publish, in the order they happened."""
        return take_batch(self._events)

    @property
    def pending(self) -> bool:
        return bool(self._events)

    def apply(self, origin: str, raws: Iterable[Any], replicas: Collection[str]) -> int:
        """Another process's starts and ends; returns how many were malformed (skipped)."""
        now, bad = time.monotonic(), 0
        self.expire(now)
        for raw in raws:
            match raw:
                case [int(key), str(replica), list(blocks)] if all(type(h) is int for h in blocks):
                    if replica in replicas:  # else one this process does not route to
                        self._start((origin, key), replica, tuple(blocks), now)
                        self.applied += 1
                case [int(key)]:
                    self._end((origin, key))
                case _:
                    bad += 1
        return bad

    def _start(
        self, who: tuple[str, int], replica: str, blocks: tuple[int, ...], now: float
    ) -> None:
        self._end(who)  # a key reused by its origin: the old entry ended
        key, self._next_key = self._next_key, self._next_key - 1
        self._remote[who] = (key, now)
        InflightPrefixes.add(self, key, replica, blocks)

    def _end(self, who: tuple[str, int]) -> None:
        entry = self._remote.pop(who, None)
        if entry is not None:
            InflightPrefixes.remove(self, entry[0])

    def expire(self, now: float) -> None:
        """Drop the others' entries older than the TTL (their process may have died)."""
        remote, oldest = self._remote, now - self._ttl_s
        while remote:
            who, (key, at) = next(iter(remote.items()))
            if at > oldest:
                break
            del remote[who]
            InflightPrefixes.remove(self, key)

    def lost(self) -> None:
        """The link went down: the others' ends may never arrive, and ours are moot."""
        for key, _ in list(self._remote.values()):
            InflightPrefixes.remove(self, key)
        self._remote.clear()
        self._told.clear()
        self._events.clear()

    def remote_count(self) -> int:
        """The others' requests in flight held here."""
        return len(self._remote)


def take_batch(events: deque[_E]) -> list[_E]:
    """Up to PER_FLUSH of `events`, oldest first, taken off the queue (one flush's share)."""
    return [events.popleft() for _ in range(min(len(events), PER_FLUSH))]
