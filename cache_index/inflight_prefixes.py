"""The prefixes of requests in flight: which replica is computing which leading blocks now.

The prefix index learns a replica's blocks from its KV events (after their prefill) or from
the gateway's record of a served request (after its first byte). Between a request's routing
and that moment, a second request with the same new prefix looks like a miss and is placed
by load, often on another replica: the prefix is then computed twice and held twice, and the
group stays split for every later turn. Measured on real vLLM and the simulator with 4 in
flight over 4 replicas: two conversations of a group sent together went to two replicas, a
loss of 0.013-0.015 of hit rate per round (benchmarks/results/2026-12-03-inflight-prefixes;
the affinity_guard picker follows them only with its `inflight` parameter set).

While a request runs its blocks cannot be evicted from its replica, so what this map says is
true from the moment vLLM schedules it. Block hashes are chained (each depends on all before
it), so a replica holding block d holds blocks 1..d of that chain: a match is a binary search.
"""

from __future__ import annotations

from collections.abc import Sequence

from cache_index.errors import CacheIndexError


class InflightPrefixes:
    """Block hash -> {replica: requests in flight whose prompt has it}, bounded in requests."""

    __slots__ = ("_entries", "_owners", "max_requests")

    def __init__(self, max_requests: int) -> None:
        if max_requests <= 0:
            raise CacheIndexError("max_requests must be positive")
        self.max_requests = max_requests
        # Request key -> (replica, its block hashes), in insertion order (the oldest first).
        self._entries: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._owners: dict[int, dict[str, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: int, replica: str, block_hashes: tuple[int, ...]) -> None:
        """Request `key` runs on `replica` with these blocks (a key already present: moved)."""
        if key in self._entries:
            self.remove(key)
        if not block_hashes:
            return
        if len(self._entries) >= self.max_requests:
            # A request never removed (a bug elsewhere) must not grow the map without bound.
            self.remove(next(iter(self._entries)))
        self._entries[key] = (replica, block_hashes)
        owners = self._owners
        for h in block_hashes:
            held = owners.get(h)
            if held is None:
                owners[h] = {replica: 1}
            else:
                held[replica] = held.get(replica, 0) + 1

    def remove(self, key: int) -> None:
        """Request `key` ended (or was never added)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        replica, block_hashes = entry
        owners = self._owners
        for h in block_hashes:
            held = owners[h]
            left = held[replica] - 1
            if left:
                held[replica] = left
            elif len(held) == 1:
                del owners[h]
            else:
                del held[replica]

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Replica -> leading blocks of `block_hashes` that a request in flight there has."""
        if not block_hashes:
            return {}
        owners = self._owners
        first = owners.get(block_hashes[0])
        if not first:
            return {}
        out: dict[str, int] = {}
        for replica in first:
            lo, hi = 1, len(block_hashes)  # invariant: block lo-1 is held; find the deepest
            while lo < hi:
                mid = (lo + hi + 1) // 2
                held = owners.get(block_hashes[mid - 1])
                if held is not None and replica in held:
                    lo = mid
                else:
                    hi = mid - 1
            out[replica] = lo
        return out

    def forget_replica(self, replica: str) -> None:
        """Drop every request of `replica` (it restarted or left)."""
        for key in [k for k, (r, _) in self._entries.items() if r == replica]:
            self.remove(key)
