"""The bounded response id -> replica index."""

from __future__ import annotations

import pytest

from cache_index.response_index import ResponseIndex


def test_put_get_and_unknown() -> None:
    idx = ResponseIndex(4)
    idx.put("resp_a", "r1")
    assert idx.get("resp_a") == "r1"
    assert idx.get("resp_b") is None
    idx.put("resp_a", "r2")  # rebinding replaces, no duplicate entry
    assert idx.get("resp_a") == "r2" and len(idx) == 1


def test_bounded_lru_drops_least_recently_used() -> None:
    idx = ResponseIndex(2)
    idx.put("a", "r1")
    idx.put("b", "r2")
    assert idx.get("a") == "r1"  # a is now the most recently used
    idx.put("c", "r3")
    assert len(idx) == 2
    assert idx.get("b") is None
    assert idx.get("a") == "r1" and idx.get("c") == "r3"


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ResponseIndex(0)
