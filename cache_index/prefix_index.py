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
from itertools import takewhile
from typing import Literal, TypeAlias

from cache_index.approx_blocks import ApproxBlocks, budget_for
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
    """One replica's cached blocks: routing history (approximate) or KV events (precise)."""

    def __init__(
        self,
        capacity: int,
        approx_capacity: int,
        resync_window_blocks: int,
        resync_miss_rate: float,
    ) -> None:
        self.capacity = capacity
        self.approx_capacity = approx_capacity
        self._keep = 1.0 - 1.0 / resync_window_blocks
        self._resync_miss_rate = resync_miss_rate
        self.precise = False
        self.last_seq: int | None = None
        self.miss_rate = 1.0
        self._approx = ApproxBlocks(approx_capacity)
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

    def depth(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`' leading blocks this replica holds in its active mode."""
        if not self.precise:
            return self._approx.depth(hashes)
        refs = self._refs
        if hashes[0] not in refs:
            return 0
        return len(list(takewhile(refs.__contains__, hashes)))

    def record_routed(self, hashes: Sequence[int]) -> None:
        if self.precise:
            return  # events are the truth; guesses would only add false hits
        self._approx.record(hashes)

    def set_capacity(self, capacity: int, approx_capacity: int) -> None:
        self.capacity, self.approx_capacity = capacity, approx_capacity
        self._approx.set_capacity(approx_capacity)
        self._trim_precise(capacity)

    def evict(self, n: int) -> int:
        """Drop up to `n` least recent entries (the index-wide memory cap needs room); dropped."""
        approx = self._approx
        from_approx = min(n, len(approx))
        removed = approx.trim(len(approx) - from_approx, budget_for(from_approx))
        if removed < from_approx:
            return removed  # the rest at the next call: one call's scan stays bounded
        before = len(self._v2o)
        self._trim_precise(max(0, before - (n - from_approx)))
        return removed + before - len(self._v2o)

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

    def clear(self, precise: bool) -> None:
        """Forget everything; `precise` says whether events are in sync afterwards."""
        self._approx.clear()
        self._v2o.clear()
        self._refs.clear()
        self.precise = precise
        self.miss_rate = 0.0 if precise else 1.0

    def desync(self) -> None:
        """Events were lost: fall back to approximate, seeded with the last precise view."""
        if self.precise:
            self._approx.adopt(self._refs)
            self.precise = False
        self._v2o.clear()
        self._refs.clear()
        self.miss_rate = 1.0

    def _resync(self) -> None:
        self._approx.clear()
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
        self._trim_precise(self.capacity)


def _tracked(medium: str | None, group_idx: int | None) -> bool:
    # Only GPU residency is a prefix-cache hit; group 0 carries the hashes of hybrid models.
    return (medium is None or medium == MEDIUM_GPU) and (group_idx is None or group_idx == 0)


class PrefixIndex:
    """Per-replica block indexes; a match walks each replica's own maps in C (see approx_blocks).

    Args: default_capacity: blocks assumed when a replica's cache size is unknown.
    approx_ratio: gateway blocks per vLLM block (e.g. 64-char blocks vs 16-token blocks).
    max_blocks_per_replica / max_total_blocks: memory caps (bytes per entry: `bench routing-cost`).
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
        # Hash -> bitmask of the replicas holding it, sharded (see approx_blocks).
        self._replicas: dict[str, ReplicaBlocks] = {}

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
        cap, approx = self._capacities(self.default_capacity)
        r = ReplicaBlocks(cap, approx, *self._resync)
        self._replicas[name] = r
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
        """Forget `name` and everything it held; its slot is reused."""
        r = self._replicas.pop(name, None)
        if r is None:
            return
        r.clear(precise=False)

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
        # Bounded: what a call cannot evict within its scan budget waits for the next call.
        for _ in range(len(self._replicas)):
            if excess <= 0:
                return
            biggest = max(self._replicas.values(), key=lambda r: r.size)
            removed = biggest.evict(min(excess, biggest.size))
            if not removed:
                return
            excess -= removed

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Replica -> number of consecutive leading blocks it holds (replicas with >= 1)."""
        out: dict[str, int] = {}
        if not block_hashes:
            return out
        for name, r in self._replicas.items():
            depth = r.depth(block_hashes)
            if depth:
                out[name] = depth
        return out
