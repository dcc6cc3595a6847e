"""Session affinity: key selection, TTL, bounds, forgetting a replica."""

from __future__ import annotations

import pytest

from cache_index.session_affinity import SessionAffinity, session_key


@pytest.mark.parametrize(
    ("header", "user", "expected"),
    [
        ("sess-1", "alice", "sess-1"),
        (None, "alice", "alice"),
        ("", "alice", "alice"),
        (None, "", None),
        (None, 42, None),
        (None, None, None),
    ],
)
def test_session_key(header: str | None, user: object, expected: str | None) -> None:
    assert session_key(header, user) == expected


def test_binding_expires_after_ttl() -> None:
    aff = SessionAffinity(ttl_s=600.0)
    aff.put("alice", "r1", now=0.0)
    assert aff.get("alice", now=599.0) == "r1"
    assert aff.get("bob", now=1.0) is None
    assert aff.get("alice", now=600.0) is None


def test_bounded_and_keyed_by_hash_whatever_the_id_length() -> None:
    aff = SessionAffinity(ttl_s=1e9, max_entries=64)
    for i in range(640):
        aff.put(f"{i}-" + "x" * 10_000, "r", now=float(i))
    assert len(aff) == 64
    assert aff.get("639-" + "x" * 10_000, now=700.0) == "r"
    assert aff.get("0-" + "x" * 10_000, now=700.0) is None


def test_forget_replica() -> None:
    aff = SessionAffinity()
    aff.put("a", "r1", now=0.0)
    aff.put("b", "r2", now=0.0)
    assert aff.forget_replica("r1") == 1
    assert aff.get("a", now=1.0) is None
    assert aff.get("b", now=1.0) == "r2"
