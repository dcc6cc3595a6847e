"""The tier-1 maps take another process's outcome only when it is later than what they hold."""

from __future__ import annotations

from cache_index.prompt_cache import PromptCache
from cache_index.session_affinity import SessionAffinity, session_hash
from gateway.shared_state.mirror import outcome_of, split


def test_an_older_write_is_refused_a_later_one_taken() -> None:
    cache = PromptCache(ttl_s=60.0, max_entries=10)
    cache.put(1, "a", now=100.0)
    assert not cache.put_if_newer(1, "b", at=99.0, now=100.5)
    assert not cache.put_if_newer(1, "b", at=100.0, now=100.5)  # a tie keeps the holder
    assert cache.get(1, 100.5) == "a"
    assert cache.put_if_newer(1, "b", at=100.2, now=100.5)
    assert cache.get(1, 100.5) == "b"
    # It expires a TTL after the decision, not after it arrived here.
    assert cache.get(1, 160.1) == "b" and cache.get(1, 160.3) is None


def test_an_outcome_already_expired_is_not_kept_and_the_bound_holds() -> None:
    cache = PromptCache(ttl_s=60.0, max_entries=10)
    assert not cache.put_if_newer(1, "a", at=10.0, now=100.0)
    assert len(cache) == 0
    for h in range(25):
        assert cache.put_if_newer(h, "a", at=100.0 + h, now=100.0)
    assert len(cache) == 10 and cache.get(24, 130.0) == "a" and cache.get(0, 130.0) is None


def test_sessions_by_their_hash() -> None:
    sessions = SessionAffinity(ttl_s=60.0, max_entries=10)
    sessions.put("user-1", "a", now=5.0)
    assert not sessions.put_if_newer(session_hash("user-1"), "b", at=4.0, now=5.0)
    assert sessions.put_if_newer(session_hash("user-1"), "b", at=6.0, now=6.0)
    assert sessions.get("user-1", 6.0) == "b"


def test_a_burst_is_split_into_bounded_messages() -> None:
    outcomes = [outcome_of(i, "r", i, None, tuple(range(1000)), 1024) for i in range(40)]
    outcomes += [outcome_of(40 + i, "r", i, None, (), 1024) for i in range(600)]
    parts = split(outcomes, 256, 16_384)
    assert [o for part in parts for o in part] == outcomes  # all of them, in order
    assert all(len(p) <= 256 and sum(len(o[4]) for o in p) <= 16_384 for p in parts)
    assert [len(p) for p in parts] == [16, 16, 256, 256, 96]  # 8 large + 248 small in the 3rd
