from __future__ import annotations

import pytest

from cache_index import CacheIndexError, InflightPrefixes, block_hashes


def chain(*tokens: int) -> tuple[int, ...]:
    """Chained hashes of one-token blocks: a shared leading run hashes the same."""
    return tuple(block_hashes(list(tokens), 1))


def test_a_request_in_flight_holds_its_leading_blocks() -> None:
    live = InflightPrefixes(100)
    live.add(1, "a", chain(1, 2, 3, 4))
    live.add(2, "b", chain(1, 2, 7))
    assert live.match(chain(1, 2, 3, 4, 5)) == {"a": 4, "b": 2}
    assert live.match(chain(1, 2, 7, 8)) == {"a": 2, "b": 3}
    assert live.match(chain(9, 1, 2)) == {}
    assert live.match(()) == {}


def test_a_request_that_ends_lets_go_and_others_keep_theirs() -> None:
    live = InflightPrefixes(100)
    live.add(1, "a", chain(1, 2, 3))
    live.add(2, "a", chain(1, 2))
    live.remove(1)
    assert live.match(chain(1, 2, 3)) == {"a": 2}
    live.remove(2)
    live.remove(2)  # twice, or never added: nothing happens
    assert live.match(chain(1, 2, 3)) == {} and len(live) == 0
    assert live._owners == {}  # nothing left behind


def test_a_retried_request_moves_to_its_new_replica() -> None:
    live = InflightPrefixes(100)
    live.add(1, "a", chain(1, 2))
    live.add(1, "b", chain(1, 2))
    assert live.match(chain(1, 2)) == {"b": 2} and len(live) == 1


def test_a_request_without_blocks_is_not_kept() -> None:
    live = InflightPrefixes(100)
    live.add(1, "a", ())
    assert len(live) == 0


def test_the_bound_drops_the_oldest_request() -> None:
    live = InflightPrefixes(2)
    live.add(1, "a", chain(1))
    live.add(2, "b", chain(2))
    live.add(3, "c", chain(3))
    assert len(live) == 2
    assert live.match(chain(1)) == {} and live.match(chain(3)) == {"c": 1}


def test_forgetting_a_replica_drops_its_requests() -> None:
    live = InflightPrefixes(100)
    live.add(1, "a", chain(1, 2))
    live.add(2, "b", chain(1))
    live.forget_replica("a")
    assert live.match(chain(1, 2)) == {"b": 1} and len(live) == 1


def test_a_bound_must_be_positive() -> None:
    with pytest.raises(CacheIndexError):
        InflightPrefixes(0)
