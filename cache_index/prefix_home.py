"""Where a prefix was last routed: sends it back there after vLLM evicted it.

The precise index (KV events) knows only what each replica's cache holds now. Under cache
pressure vLLM evicts a group's shared prefix between two of its requests; the next request
then looks like a brand-new prefix and would be placed anew, splitting the group over two
replicas: its prefix is then held twice and its load shared by chance. Routing it back to
the replica that last served it recomputes the prefix there and keeps the prefix-to-replica
map stable, as routers that keep their own routing tree do (SGLang's cache-aware policy).

One map, block hash -> replica that was last sent a prompt containing it, LRU-bounded. A
lookup finds the deepest leading block with an entry by binary search: leading blocks of a
routed prompt are recorded together, so their presence is prefix-closed up to evictions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from cache_index.errors import CacheIndexError


class PrefixHome:
    """Block hash -> the replica last routed a prompt with that block (bounded LRU)."""

    def __init__(self, max_entries: int) -> None:
        if max_entries <= 0:
            raise CacheIndexError("max_entries must be positive")
        self.max_entries = max_entries
        self._lru: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def record(self, replica: str, block_hashes: Sequence[int]) -> None:
        """`replica` was sent a prompt with these blocks (leading blocks end most recent)."""
        lru = self._lru
        for h in reversed(block_hashes):
            lru[h] = replica
            lru.move_to_end(h)
        while len(lru) > self.max_entries:
            lru.popitem(last=False)

    def lookup(self, block_hashes: Sequence[int]) -> tuple[str, int] | None:
        """(replica, depth) of the deepest leading block with a home; None if the first has none."""
        lru = self._lru
        if not block_hashes or block_hashes[0] not in lru:
            return None
        lo, hi = 1, len(block_hashes)  # invariant: block lo-1 has a home; find the deepest
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if block_hashes[mid - 1] in lru:
                lo = mid
            else:
                hi = mid - 1
        return lru[block_hashes[lo - 1]], lo

    def forget_replica(self, replica: str) -> None:
        """Drop every entry pointing at `replica` (it restarted or left)."""
        for h in [h for h, r in self._lru.items() if r == replica]:
            del self._lru[h]
