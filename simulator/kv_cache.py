"""Paged KV cache of one replica: chained block hashes, pinned blocks, LRU eviction of free ones."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from vllm_api.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
)

_MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class Allocation:
    """Blocks held by one request, in sequence order (mutable: decode appends to it)."""

    blocks: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0


class KVCache:
    """num_blocks x block_size tokens; full prompt blocks are findable by their chained hash."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_seed: int = 0,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Seeded per replica like vLLM's PYTHONHASHSEED: hashes differ across replicas.
        self._root = xxhash.xxh64_intdigest(b"sim-kv-root", seed=hash_seed & _MASK64)
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # Free blocks that hold no cached content are handed out before any cached one is evicted.
        self._plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._by_hash: dict[int, int] = {}
        self._events: list[KvEvent] = []

    @property
    def num_free(self) -> int:
        return len(self._plain) + len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(
        self, token_ids: Sequence[int], lora_name: str | None = None, cache_salt: str | None = None
    ) -> list[int]:
        """Chained hashes of every full block; LoRA name in all blocks, salt in the first only."""
        bs = self.block_size
        lora = (lora_name or "").encode()
        parent = self._root
        out: list[int] = []
        for start in range(0, len(token_ids) - bs + 1, bs):
            data = (
                parent.to_bytes(8, "little") + array("i", token_ids[start : start + bs]).tobytes()
            )
            if lora:
                data += b"\x00L" + lora
            if start == 0 and cache_salt:
                data += b"\x00S" + cache_salt.encode()
            parent = xxhash.xxh3_64_intdigest(data)
            out.append(parent)
        return out

    def match(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Number of leading blocks cached; the last token is always recomputed, as in vLLM."""
        if not self.enable_prefix_caching:
            return 0
        limit = min(len(hashes), (num_tokens - 1) // self.block_size)
        n = 0
        while n < limit and hashes[n] in self._by_hash:
            n += 1
        return n

    def allocate(
        self,
        token_ids: Sequence[int],
        hashes: Sequence[int],
        num_tokens: int,
        lora_name: str | None = None,
        *,
        lora_id: int | None = None,
        cache_salt: str | None = None,
    ) -> Allocation | None:
        """Pin the cached prefix and take new blocks for `num_tokens`; None if they don't fit."""
        hit = self.match(hashes, num_tokens)
        hit_blocks = [self._by_hash[h] for h in hashes[:hit]]
        need = self.blocks_for(num_tokens) - hit
        reusable_free = sum(1 for b in hit_blocks if self._ref[b] == 0)
        if need > self.num_free - reusable_free:
            return None
        for b in hit_blocks:
            if self._ref[b] == 0:
                del self._lru[b]
            self._ref[b] += 1
        new = self._take(need)
        blocks = hit_blocks + new
        if self.enable_prefix_caching:
            self._store(blocks, hashes, hit, token_ids, lora_name, lora_id, cache_salt)
        return Allocation(blocks, hit * self.block_size)

    def grow(self, alloc: Allocation, num_tokens: int) -> bool:
        """Make room for `num_tokens` in total (decode); False when no block is free."""
        need = self.blocks_for(num_tokens) - len(alloc.blocks)
        if need <= 0:
            return True
        if need > self.num_free:
            return False
        alloc.blocks.extend(self._take(need))
        return True

    def free(self, alloc: Allocation) -> None:
        """Unpin; tail blocks go first in LRU order so a shared prefix outlives its suffixes."""
        for b in reversed(alloc.blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._hash[b] is None:
                    self._plain.append(b)
                else:
                    self._lru[b] = None
        alloc.blocks.clear()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash and announce it; refused (False) while a block is pinned."""
        if any(self._ref):
            return False
        for b in self._lru:
            self._plain.append(b)
        self._lru.clear()
        for i in range(self.num_blocks):
            self._hash[i] = None
        self._by_hash.clear()
        self._events.append(AllBlocksCleared())
        return True

    def clear(self) -> None:
        """Engine restart: every block free and uncached (callers drop their allocations)."""
        self._ref = [0] * self.num_blocks
        self._hash = [None] * self.num_blocks
        self._plain = list(range(self.num_blocks - 1, -1, -1))
        self._lru.clear()
        self._by_hash.clear()
        self._events.append(AllBlocksCleared())

    def drain_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    def _take(self, n: int) -> list[int]:
        out: list[int] = []
        evicted: list[int] = []
        for _ in range(n):
            if self._plain:
                b = self._plain.pop()
            else:
                b, _unused = self._lru.popitem(last=False)
                h = self._hash[b]
                if h is not None:
                    del self._by_hash[h]
                    self._hash[b] = None
                    evicted.append(h)
            self._ref[b] = 1
            out.append(b)
        if evicted:
            self._events.append(BlockRemoved(block_hashes=tuple(evicted), medium=MEDIUM_GPU))
        return out

    def _store(
        self,
        blocks: list[int],
        hashes: Sequence[int],
        hit: int,
        token_ids: Sequence[int],
        lora_name: str | None,
        lora_id: int | None,
        cache_salt: str | None,
    ) -> None:
        stored: list[int] = []
        bs = self.block_size
        for i in range(hit, min(len(hashes), len(blocks))):
            h = hashes[i]
            if h in self._by_hash:
                break  # a duplicate chain is already resident; keep this copy uncached
            self._by_hash[h] = blocks[i]
            self._hash[blocks[i]] = h
            stored.append(h)
        if stored:
            # vLLM 0.32's per-block extra keys: (lora name, cache salt on the first block only).
            extra: list[tuple[object, ...] | None] = []
            for i in range(hit, hit + len(stored)):
                keys = ((lora_name,) if lora_name else ()) + (
                    (cache_salt,) if cache_salt and i == 0 else ()
                )
                extra.append(keys or None)
            self._events.append(
                BlockStored(
                    block_hashes=tuple(stored),
                    parent_block_hash=hashes[hit - 1] if hit > 0 else None,
                    token_ids=tuple(token_ids[hit * bs : (hit + len(stored)) * bs]),
                    block_size=bs,
                    lora_name=lora_name,
                    medium=MEDIUM_GPU,
                    lora_id=lora_id,
                    extra_keys=tuple(extra),
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                )
            )
