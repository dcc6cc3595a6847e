"""Tier 1 prompt cache: TTL, bounded LRU, forgetting a replica."""

from __future__ import annotations

import pytest

from cache_index.errors import CacheIndexError
from cache_index.prompt_cache import PromptCache


@pytest.mark.parametrize(
    ("at", "expected"), [(0.0, "r1"), (59.999, "r1"), (60.0, None), (1000.0, None)]
)
def test_ttl(at: float, expected: str | None) -> None:
    cache = PromptCache(ttl_s=60.0)
    cache.put(1, "r1", now=0.0)
    assert cache.get(1, now=at) == expected


def test_put_restarts_the_ttl_and_replaces_the_replica() -> None:
    cache = PromptCache(ttl_s=10.0)
    cache.put(1, "r1", now=0.0)
    cache.put(1, "r2", now=8.0)
    assert cache.get(1, now=17.0) == "r2"
    assert cache.get(1, now=18.0) is None
    assert len(cache) == 0  # the expired entry was dropped by the lookup


def test_bounded_at_ten_times_capacity_keeping_the_most_recent() -> None:
    cache = PromptCache(ttl_s=1e9, max_entries=100)
    for h in range(1000):
        cache.put(h, f"r{h % 3}", now=float(h))
        assert len(cache) <= 100
    assert cache.get(899, now=1000.0) is None
    assert cache.get(900, now=1000.0) == "r0"
    assert cache.get(999, now=1000.0) == "r0"


def test_re_put_moves_an_entry_to_the_back_of_the_eviction_order() -> None:
    cache = PromptCache(ttl_s=1e9, max_entries=2)
    cache.put(1, "a", now=0.0)
    cache.put(2, "b", now=1.0)
    cache.put(1, "a", now=2.0)
    cache.put(3, "c", now=3.0)
    assert [cache.get(h, now=4.0) for h in (1, 2, 3)] == ["a", None, "c"]


def test_expired_entries_are_pruned_on_put() -> None:
    cache = PromptCache(ttl_s=5.0)
    for h in range(50):
        cache.put(h, "r", now=0.0)
    cache.put(99, "r", now=5.0)
    assert len(cache) == 1


def test_forget_replica() -> None:
    cache = PromptCache()
    for h in range(10):
        cache.put(h, "gone" if h % 2 else "kept", now=0.0)
    assert cache.forget_replica("gone") == 5
    assert len(cache) == 5
    assert cache.get(1, now=1.0) is None
    assert cache.get(2, now=1.0) == "kept"


@pytest.mark.parametrize(("ttl_s", "max_entries"), [(0.0, 10), (-1.0, 10), (1.0, 0)])
def test_rejects_bad_config(ttl_s: float, max_entries: int) -> None:
    with pytest.raises(CacheIndexError):
        PromptCache(ttl_s=ttl_s, max_entries=max_entries)
