"""Tier 1: whole-prompt hash -> the replica that served it last, with a TTL and an entry cap."""

from __future__ import annotations

from collections import OrderedDict

from cache_index.errors import CacheIndexError


class PromptCache:
    """Bounded TTL map from a prompt hash to a replica name.

    Entries are ordered by their last `put`: the gateway puts after every routing decision,
    so that is the last use, and with one TTL for all entries it is also expiry order, which
    makes pruning expired entries and evicting the least recent one both pop from the front.
    """

    def __init__(self, ttl_s: float = 60.0, max_entries: int = 100_000) -> None:
        if ttl_s <= 0:
            raise CacheIndexError(f"ttl_s must be positive, got {ttl_s}")
        if max_entries <= 0:
            raise CacheIndexError(f"max_entries must be positive, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, h: int, now: float) -> str | None:
        """The replica for `h`, or None when absent or expired (an expired entry is dropped)."""
        entry = self._entries.get(h)
        if entry is None:
            return None
        replica, expires = entry
        if now >= expires:
            del self._entries[h]
            return None
        return replica

    def put(self, h: int, replica: str, now: float) -> None:
        """Record that `replica` served `h` at `now`; the TTL restarts."""
        entries = self._entries
        entries[h] = (replica, now + self.ttl_s)
        entries.move_to_end(h)
        self._prune(now)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def put_if_newer(self, h: int, replica: str, at: float, now: float) -> bool:
        """`put` as of `at` (another process's decision), unless the entry holds a later one."""
        entries = self._entries
        expires = at + self.ttl_s
        entry = entries.get(h)
        # One TTL for all: a later expiry is a later put (last writer wins).
        if expires <= now or (entry is not None and entry[1] >= expires):
            return False
        entries[h] = (replica, expires)
        entries.move_to_end(h)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
        return True

    def forget_replica(self, replica: str) -> int:
        """Drop every entry pointing at `replica` (removed or restarted); returns how many."""
        # A linear scan: replicas leave rarely, and a reverse index would double per-entry memory.
        stale = [h for h, (name, _) in self._entries.items() if name == replica]
        for h in stale:
            del self._entries[h]
        return len(stale)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()

    def _prune(self, now: float) -> None:
        entries = self._entries
        while entries:
            h, (_, expires) = next(iter(entries.items()))
            if now < expires:
                return
            del entries[h]
