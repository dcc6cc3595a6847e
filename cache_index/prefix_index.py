"""Tier 2: which replica holds the longest run of a prompt's leading blocks.

Each replica is in one of two modes:
- precise: fed by its vLLM KV events; vLLM's block hash is mapped to the gateway's own
  chained hash of the event's token ids, so request hashes computed here match it.
- approximate: fed by the gateway's routing history (an LRU sized from the replica's cache).
A replica starts approximate. A sequence gap (or joining its stream mid-way) clears its
precise map, seeds the approximate LRU with what it held, and keeps applying events to the
cleared map. It becomes precise again on a restart (seq 0), on AllBlocksCleared, or once
nearly every stored chain can be placed again (a moving miss rate over
`resync_window_blocks` blocks falls to `resync_miss_rate`): chains rooted before the gap
cannot be placed, so a high miss rate means the rebuilt map is still partial.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Literal, TypeAlias

from cache_index.errors import CacheIndexError
from cache_index.hashing import block_hashes
from vllm_api.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
)

Mode: TypeAlias = Literal["precise", "approximate"]
# (token_ids, block_size, lora_name, parent's own hash or None at a chain start) -> own hashes.
TokensToHashes: TypeAlias = Callable[[Sequence[int], int, str | None, int | None], list[int]]


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """Counters of one replica's index, for metrics."""

    mode: Mode
    blocks: int
    capacity: int
    batches: int
    events_applied: int
    gaps: int
    restarts: int
    resyncs: int
    unplaceable_blocks: int
    ignored_events: int
    miss_rate: float
    last_seq: int | None


class ReplicaBlocks:
    """One replica's cached blocks; marks the hashes of its active mode in the shared owners map."""

    def __init__(
        self,
        bit: int,
        owners: dict[int, int],
        capacity: int,
        approx_capacity: int,
        resync_window_blocks: int,
        resync_miss_rate: float,
    ) -> None:
        self.bit = bit
        self._owners = owners
        self.capacity = capacity
        self.approx_capacity = approx_capacity
        self._keep = 1.0 - 1.0 / resync_window_blocks
        self._resync_miss_rate = resync_miss_rate
        self.precise = False
        self.last_seq: int | None = None
        self.miss_rate = 1.0
        self._approx: OrderedDict[int, None] = OrderedDict()
        self._v2o: OrderedDict[int, int] = OrderedDict()
        # Own hash -> how many vLLM hashes map to it (vLLM may key on things we do not hash).
        self._refs: dict[int, int] = {}
        self.batches = self.events_applied = self.gaps = self.restarts = self.resyncs = 0
        self.unplaceable_blocks = self.ignored_events = 0

    @property
    def size(self) -> int:
        return len(self._approx) + len(self._v2o)

    def stats(self) -> ReplicaStats:
        return ReplicaStats(
            mode="precise" if self.precise else "approximate",
            blocks=len(self._refs) if self.precise else len(self._approx),
            capacity=self.capacity,
            batches=self.batches,
            events_applied=self.events_applied,
            gaps=self.gaps,
            restarts=self.restarts,
            resyncs=self.resyncs,
            unplaceable_blocks=self.unplaceable_blocks,
            ignored_events=self.ignored_events,
            miss_rate=self.miss_rate,
            last_seq=self.last_seq,
        )

    def _mark(self, h: int) -> None:
        self._owners[h] = self._owners.get(h, 0) | self.bit

    def _unmark(self, h: int) -> None:
        left = self._owners.get(h, 0) & ~self.bit
        if left:
            self._owners[h] = left
        else:
            self._owners.pop(h, None)

    def record_routed(self, hashes: Sequence[int]) -> None:
        if self.precise:
            return  # events are the truth; guesses would only add false hits
        lru = self._approx
        # Reversed so a prompt's leading blocks are the most recent: LRU then evicts tails
        # first, as vLLM does, and a shared prefix outlives the suffixes hanging off it.
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._mark(h)
        self._trim_approx(self.approx_capacity)

    def set_capacity(self, capacity: int, approx_capacity: int) -> None:
        self.capacity, self.approx_capacity = capacity, approx_capacity
        self._trim_approx(approx_capacity)
        self._trim_precise(capacity)

    def evict(self, n: int) -> None:
        """Drop `n` least recent entries (the index-wide memory cap needs room)."""
        from_approx = min(n, len(self._approx))
        self._trim_approx(len(self._approx) - from_approx)
        self._trim_precise(max(0, len(self._v2o) - (n - from_approx)))

    def _trim_approx(self, limit: int) -> None:
        lru = self._approx
        while len(lru) > limit:
            h, _ = lru.popitem(last=False)
            self._unmark(h)

    def _trim_precise(self, limit: int) -> None:
        # Over capacity means removals were missed: the oldest stores are the likeliest gone.
        while len(self._v2o) > limit:
            _, own = self._v2o.popitem(last=False)
            self._deref(own)

    def _deref(self, own: int) -> None:
        left = self._refs[own] - 1
        if left:
            self._refs[own] = left
            return
        del self._refs[own]
        if self.precise:
            self._unmark(own)

    def clear(self, precise: bool) -> None:
        """Forget everything; `precise` says whether events are in sync afterwards."""
        for h in self._approx:
            self._unmark(h)
        if self.precise:
            for h in self._refs:
                self._unmark(h)
        self._approx.clear()
        self._v2o.clear()
        self._refs.clear()
        self.precise = precise
        self.miss_rate = 0.0 if precise else 1.0

    def desync(self) -> None:
        """Events were lost: fall back to approximate, seeded with the last precise view."""
        if self.precise:
            # Already marked: the approximate LRU just takes the marks over.
            self._approx = OrderedDict.fromkeys(self._refs)
            self.precise = False
            self._trim_approx(self.approx_capacity)
        self._v2o.clear()
        self._refs.clear()
        self.miss_rate = 1.0

    def _resync(self) -> None:
        for h in self._approx:
            self._unmark(h)
        self._approx.clear()
        for h in self._refs:
            self._mark(h)
        self.precise = True
        self.resyncs += 1

    def apply(self, batch: EventBatch, seq: int, tokens_to_hashes: TokensToHashes) -> None:
        if seq < 0:
            return  # replay end marker, not a batch
        if seq == 0:
            if self.last_seq is not None:
                self.restarts += 1
            # A publisher starts at 0 with an empty cache, and vLLM's hash seed changed.
            self.clear(precise=True)
        elif self.last_seq is None or seq != self.last_seq + 1:
            if self.last_seq is not None:
                self.gaps += 1
            self.desync()
        self.last_seq = seq
        self.batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored) and _tracked(event.medium, event.group_idx):
                self._store(event, tokens_to_hashes)
            elif isinstance(event, BlockRemoved) and _tracked(event.medium, event.group_idx):
                for v in event.block_hashes:
                    own = self._v2o.pop(v, None)
                    if own is not None:
                        self._deref(own)
            elif isinstance(event, AllBlocksCleared):
                self.clear(precise=True)
            else:
                self.ignored_events += 1
                continue
            self.events_applied += 1
        if not self.precise and self.miss_rate <= self._resync_miss_rate:
            self._resync()

    def _store(self, event: BlockStored, tokens_to_hashes: TokensToHashes) -> None:
        n = len(event.block_hashes)
        parent: int | None = None
        if event.parent_block_hash is not None:
            parent = self._v2o.get(event.parent_block_hash)
        own: list[int] = []
        if parent is not None or event.parent_block_hash is None:
            own = tokens_to_hashes(event.token_ids, event.block_size, event.lora_name, parent)
        if len(own) != n:
            # Unknown parent (stored before we listened, or evicted from our map) or tokens
            # that do not fill the blocks: no own hash can be chained for these.
            self.unplaceable_blocks += n
            self.miss_rate = 1.0 - (1.0 - self.miss_rate) * self._keep**n
            return
        self.miss_rate *= self._keep**n
        v2o, refs = self._v2o, self._refs
        for v, o in zip(event.block_hashes, own, strict=True):
            if v in v2o:
                v2o.move_to_end(v)
                continue
            v2o[v] = o
            count = refs.get(o, 0)
            refs[o] = count + 1
            if count == 0 and self.precise:
                self._mark(o)
        self._trim_precise(self.capacity)


def _tracked(medium: str | None, group_idx: int | None) -> bool:
    # Only GPU residency is a prefix-cache hit; group 0 carries the hashes of hybrid models.
    return (medium is None or medium == MEDIUM_GPU) and (group_idx is None or group_idx == 0)


class PrefixIndex:
    """Per-replica block indexes plus one hash -> replica bitmask map for fast matching.

    Args: default_capacity: blocks assumed when a replica's cache size is unknown.
    approx_ratio: gateway blocks per vLLM block (e.g. 64-char blocks vs 16-token blocks).
    max_blocks_per_replica / max_total_blocks: memory caps (an entry costs ~200-250 bytes).
    seed: root seed of the own chained hash (must match the gateway's request hashing).
    """

    def __init__(
        self,
        *,
        default_capacity: int = 16_384,
        approx_ratio: float = 1.0,
        max_blocks_per_replica: int = 1 << 20,
        max_total_blocks: int = 2_000_000,
        max_replicas: int = 256,
        seed: int = 0,
        resync_window_blocks: int = 256,
        resync_miss_rate: float = 0.02,
    ) -> None:
        if min(default_capacity, max_blocks_per_replica, max_total_blocks, max_replicas) <= 0:
            raise CacheIndexError("capacities and max_replicas must be positive")
        if approx_ratio <= 0 or resync_window_blocks <= 1 or not 0 < resync_miss_rate < 1:
            raise CacheIndexError("bad approx_ratio, resync_window_blocks or resync_miss_rate")
        self.default_capacity = default_capacity
        self.approx_ratio = approx_ratio
        self.max_blocks_per_replica = max_blocks_per_replica
        self.max_total_blocks = max_total_blocks
        self.max_replicas = max_replicas
        self.seed = seed
        self._resync = (resync_window_blocks, resync_miss_rate)
        self._owners: dict[int, int] = {}
        self._replicas: dict[str, ReplicaBlocks] = {}
        self._names: dict[int, str] = {}  # bit index -> replica name

    def __len__(self) -> int:
        return sum(r.size for r in self._replicas.values())

    def replicas(self) -> list[str]:
        """Names of the replicas known to the index."""
        return list(self._replicas)

    def _replica(self, name: str) -> ReplicaBlocks:
        r = self._replicas.get(name)
        if r is not None:
            return r
        if len(self._replicas) >= self.max_replicas:
            raise CacheIndexError(f"more than {self.max_replicas} replicas")
        index = next(i for i in range(self.max_replicas) if i not in self._names)
        cap, approx = self._capacities(self.default_capacity)
        r = ReplicaBlocks(1 << index, self._owners, cap, approx, *self._resync)
        self._replicas[name] = r
        self._names[index] = name
        return r

    def _capacities(self, blocks: int) -> tuple[int, int]:
        cap = min(max(1, blocks), self.max_blocks_per_replica)
        approx = min(max(1, int(blocks * self.approx_ratio)), self.max_blocks_per_replica)
        return cap, approx

    def set_capacity(self, replica: str, blocks: int) -> None:
        """Size `replica`'s index from its cache (vLLM's num_gpu_blocks)."""
        self._replica(replica).set_capacity(*self._capacities(blocks))

    def mode(self, replica: str) -> Mode:
        """How `replica`'s entries are known; unknown replicas are approximate."""
        r = self._replicas.get(replica)
        return "precise" if r is not None and r.precise else "approximate"

    def blocks(self, replica: str) -> int:
        """Blocks the index holds for `replica` in its active mode (0 if unknown)."""
        r = self._replicas.get(replica)
        return 0 if r is None else r.size

    def stats(self) -> dict[str, ReplicaStats]:
        """Per-replica counters for metrics."""
        return {name: r.stats() for name, r in self._replicas.items()}

    def remove_replica(self, name: str) -> None:
        """Forget `name` and everything it held; its bit is reused."""
        r = self._replicas.pop(name, None)
        if r is None:
            return
        r.clear(precise=False)
        del self._names[r.bit.bit_length() - 1]

    def record_routed(self, replica: str, block_hashes: Sequence[int], now: float) -> None:
        """The gateway sent these blocks to `replica`: assume them cached (approximate mode).

        `now` is accepted for symmetry with the other tiers; LRU order is what ages entries.
        """
        del now
        self._replica(replica).record_routed(block_hashes)
        self._enforce_total()

    def apply_events(
        self,
        replica: str,
        batch: EventBatch,
        seq: int,
        tokens_to_hashes: TokensToHashes | None = None,
    ) -> None:
        """Apply one KV-event batch of `replica` with its ZMQ sequence number."""
        self._replica(replica).apply(batch, seq, tokens_to_hashes or self._own_hashes)
        self._enforce_total()

    def _own_hashes(
        self, token_ids: Sequence[int], block_size: int, lora: str | None, parent: int | None
    ) -> list[int]:
        if parent is not None:
            return block_hashes(token_ids, block_size, seed=parent)
        extra = lora.encode() if lora else b""
        return block_hashes(token_ids, block_size, seed=self.seed, extra=extra)

    def _enforce_total(self) -> None:
        excess = len(self) - self.max_total_blocks
        while excess > 0:
            biggest = max(self._replicas.values(), key=lambda r: r.size)
            n = min(excess, biggest.size)
            biggest.evict(n)
            excess -= n

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Replica -> number of consecutive leading blocks it holds (replicas with >= 1)."""
        out: dict[str, int] = {}
        if not block_hashes:
            return out
        get = self._owners.get
        alive = get(block_hashes[0], 0)
        depth = 1
        if alive:
            for h in islice(block_hashes, 1, None):
                held = alive & get(h, 0)
                if held != alive:
                    self._emit(alive & ~held, depth, out)
                    alive = held
                    if not alive:
                        break
                depth += 1
            self._emit(alive, depth, out)
        return out

    def _emit(self, bits: int, depth: int, out: dict[str, int]) -> None:
        names = self._names
        while bits:
            low = bits & -bits
            out[names[low.bit_length() - 1]] = depth
            bits ^= low
