from __future__ import annotations

import pytest

from cache_index import CacheIndexError, PrefixHome


def test_the_deepest_leading_block_with_a_home_wins() -> None:
    homes = PrefixHome(max_entries=100)
    homes.record("a", [1, 2, 3, 4])
    homes.record("b", [1, 2, 7])  # the shared blocks 1, 2 now live with b
    assert homes.lookup([1, 2, 3, 4, 5]) == ("a", 4)
    assert homes.lookup([1, 2, 9]) == ("b", 2)
    assert homes.lookup([1, 2, 7, 8]) == ("b", 3)
    assert homes.lookup([9, 1, 2]) is None  # the first block decides
    assert homes.lookup([]) is None


def test_the_bound_evicts_the_least_recent_tails_first() -> None:
    homes = PrefixHome(max_entries=4)
    homes.record("a", [1, 2, 3])
    homes.record("b", [10, 11])  # over the bound: a's tail block 3 goes first
    assert len(homes) == 4
    assert homes.lookup([1, 2, 3]) == ("a", 2)
    assert homes.lookup([10, 11]) == ("b", 2)


def test_forgetting_a_replica_drops_its_homes() -> None:
    homes = PrefixHome(max_entries=100)
    homes.record("a", [1, 2])
    homes.record("b", [5])
    homes.forget_replica("a")
    assert homes.lookup([1, 2]) is None and homes.lookup([5]) == ("b", 1)


def test_a_bound_must_be_positive() -> None:
    with pytest.raises(CacheIndexError):
        PrefixHome(0)
