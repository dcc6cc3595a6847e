from simulator.kv_cache import KVCache
from vllm_api.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


def _alloc(cache: KVCache, tokens: list[int]):
    hashes = cache.block_hashes(tokens)
    return cache.allocate(tokens, hashes, len(tokens))


def test_prefix_hit_counts_whole_blocks_and_keeps_last_token_uncached() -> None:
    cache = KVCache(16, 4)
    tokens = list(range(100, 112))  # exactly 3 blocks
    a = _alloc(cache, tokens)
    assert a is not None and a.num_cached_tokens == 0
    events = cache.drain_events()
    assert len(events) == 1 and isinstance(events[0], BlockStored)
    assert events[0].parent_block_hash is None and events[0].token_ids == tuple(tokens)
    cache.free(a)
    b = _alloc(cache, tokens)
    # The last token is always recomputed, so the third block cannot be a hit.
    assert b is not None and b.num_cached_tokens == 8
    c = _alloc(cache, [*tokens, 7])
    assert c is not None and c.num_cached_tokens == 12


def test_block_hashes_are_chained_and_seeded_per_replica() -> None:
    a, b = KVCache(8, 4, hash_seed=1), KVCache(8, 4, hash_seed=2)
    t = [1, 2, 3, 4, 5, 6, 7, 8]
    assert a.block_hashes(t) != b.block_hashes(t)
    assert a.block_hashes(t) == KVCache(8, 4, hash_seed=1).block_hashes(t)
    assert a.block_hashes([9, 9, 9, 9, 5, 6, 7, 8])[1] != a.block_hashes(t)[1]
    assert a.block_hashes(t, cache_salt="s")[0] != a.block_hashes(t)[0]
    assert a.block_hashes(t, lora_name="l")[1] != a.block_hashes(t)[1]


def test_pinned_blocks_are_never_evicted_and_free_ones_go_lru() -> None:
    cache = KVCache(4, 2)
    first = _alloc(cache, [1, 2, 3, 4, 5])  # 3 blocks, 2 full ones cached
    assert first is not None and cache.num_free == 1
    assert _alloc(cache, [7, 8, 9, 10, 11]) is None  # needs 3, only 1 free: waits
    cache.free(first)
    cache.drain_events()
    second = _alloc(cache, [7, 8, 9, 10, 11])
    assert second is not None
    removed = [e for e in cache.drain_events() if isinstance(e, BlockRemoved)]
    assert removed and removed[0].medium == "GPU"
    assert cache.num_free == 1


def test_reset_and_clear_announce_all_blocks_cleared() -> None:
    cache = KVCache(8, 2)
    a = _alloc(cache, [1, 2, 3, 4, 5])
    assert a is not None
    cache.free(a)
    cache.drain_events()
    pinned = _alloc(cache, [9, 9, 9])
    assert pinned is not None
    cache.drain_events()
    assert cache.reset_prefix_cache() is False  # vLLM refuses while a block is in use
    assert cache.drain_events() == [] and cache.num_cached > 0
    cache.free(pinned)
    cache.drain_events()
    assert cache.reset_prefix_cache() is True
    assert cache.drain_events() == [AllBlocksCleared()]
    assert cache.num_cached == 0 and cache.num_free == 8
    again = _alloc(cache, [1, 2, 3, 4, 5])
    assert again is not None and again.num_cached_tokens == 0
    cache.clear()
    assert cache.num_free == 8 and isinstance(cache.drain_events()[-1], AllBlocksCleared)


def test_disabled_prefix_caching_never_hits_or_emits() -> None:
    cache = KVCache(8, 2, enable_prefix_caching=False)
    a = _alloc(cache, [1, 2, 3, 4, 5])
    assert a is not None
    cache.free(a)
    b = _alloc(cache, [1, 2, 3, 4, 5])
    assert b is not None and b.num_cached_tokens == 0 and cache.drain_events() == []


def test_block_stored_carries_lora_id_and_per_block_extra_keys() -> None:
    cache = KVCache(16, 4)
    tokens = list(range(200, 212))  # 3 blocks
    plain = _alloc(cache, tokens)
    assert plain is not None
    (event,) = cache.drain_events()
    assert isinstance(event, BlockStored)
    assert event.lora_id is None and event.extra_keys == (None, None, None)
    hashes = cache.block_hashes(tokens, "ad", "salt")
    alloc = cache.allocate(tokens, hashes, len(tokens), "ad", lora_id=2, cache_salt="salt")
    assert alloc is not None
    (event,) = cache.drain_events()
    assert isinstance(event, BlockStored)
    assert event.lora_name == "ad" and event.lora_id == 2
    # The salt is part of the first block's key only; the adapter is part of every block's.
    assert event.extra_keys == (("ad", "salt"), ("ad",), ("ad",))
