"""The admission queue across tenants: weighted fair shares, strict classes with aging, depth."""

from __future__ import annotations

from collections import Counter

import pytest

from cache_index.admission_queue import AdmissionQueue, QueueFull
from cache_index.errors import CacheIndexError

SHORT, LONG = "le128", "gt512"


def _pop_ids(q: AdmissionQueue, n: int, now: float = 0.0) -> list[str]:
    out = []
    for _ in range(n):
        t = q.pop(now)
        assert t is not None
        out.append(t.item_id)
    return out


def test_two_backlogged_tenants_share_dispatches_by_weight() -> None:
    q = AdmissionQueue(max_depth=1000)
    for i in range(400):
        q.push(f"a{i}", "m", SHORT, now=0.0, tenant="a", weight=2.0)
        q.push(f"b{i}", "m", SHORT, now=0.0, tenant="b", weight=1.0)
    served = Counter(q.pop(now=1.0).tenant for _ in range(300))  # type: ignore[union-attr]
    assert served["a"] == pytest.approx(200, rel=0.05)
    assert served["b"] == pytest.approx(100, rel=0.05)


def test_equal_tenants_alternate_and_each_keeps_its_fifo() -> None:
    q = AdmissionQueue()
    for i in range(3):
        q.push(f"a{i}", "m", SHORT, now=0.0, tenant="a")
    for i in range(3):
        q.push(f"b{i}", "m", SHORT, now=0.0, tenant="b")
    assert _pop_ids(q, 6) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_tenant_joining_a_flood_is_served_within_one_dispatch() -> None:
    q = AdmissionQueue(max_depth=1000)
    for i in range(200):
        q.push(f"g{i}", "m", SHORT, now=0.0, tenant="greedy")
    _pop_ids(q, 50)  # the flood has been served alone for a while: no credit for the other
    q.push("p0", "m", SHORT, now=1.0, tenant="polite")
    order = _pop_ids(q, 2, now=1.0)
    assert "p0" in order


def test_classes_are_strict_whatever_the_tenant_bucket_or_arrival() -> None:
    q = AdmissionQueue(max_depth=100)
    for i in range(5):
        q.push(f"p2-{i}", "m", SHORT, now=0.0, tenant="a", priority=2)
    q.push("p1", "m", LONG, now=0.1, tenant="b", priority=1)
    q.push("p0", "m", LONG, now=0.2, tenant="a", weight=0.1, priority=0)
    assert _pop_ids(q, 3, now=0.3) == ["p0", "p1", "p2-0"]


def test_a_lower_class_ticket_that_waited_age_first_s_goes_first() -> None:
    q = AdmissionQueue(max_wait_s=30.0, age_first_s=5.0, max_depth=100)
    q.push("low", "m", SHORT, now=0.0, tenant="a", priority=2)
    for i in range(10):
        q.push(f"hi{i}", "m", SHORT, now=4.0, tenant="b", priority=0)
    assert q.pop(now=4.9).item_id == "hi0"  # type: ignore[union-attr]
    assert q.pop(now=5.0).item_id == "low"  # type: ignore[union-attr]
    assert q.pop(now=5.0).item_id == "hi1"  # type: ignore[union-attr]


def test_an_aged_flood_does_not_put_another_tenant_behind_its_backlog() -> None:
    q = AdmissionQueue(max_wait_s=30.0, age_first_s=5.0, max_depth=1000)
    for i in range(100):
        q.push(f"g{i}", "m", SHORT, now=0.0, tenant="greedy")
    q.push("p0", "m", SHORT, now=9.0, tenant="polite")
    # Every greedy ticket is past the aging threshold; the fresh one still gets its turn.
    assert "p0" in _pop_ids(q, 2, now=10.0)


def test_max_depth_is_per_tenant_so_a_flood_cannot_fill_the_queue() -> None:
    q = AdmissionQueue(max_depth=3, max_wait_s=20.0)
    for i in range(3):
        q.push(f"g{i}", "m", SHORT, now=0.0, tenant="greedy")
    with pytest.raises(QueueFull) as info:
        q.push("g3", "m", SHORT, now=0.0, tenant="greedy")
    assert info.value.tenant == "greedy" and "'greedy'" in str(info.value)
    assert 1.0 <= info.value.retry_after_s <= 20.0
    for i in range(3):
        q.push(f"p{i}", "m", SHORT, now=0.0, tenant="polite")
    q.push("g-long", "m", LONG, now=0.0, tenant="greedy")  # another bucket: its own bound
    assert q.tenant_depth() == {"greedy": 4, "polite": 3}
    assert q.depth()[("m", SHORT)] == 6


def test_requeue_keeps_the_place_and_refunds_the_turn() -> None:
    q = AdmissionQueue(max_depth=1)
    q.push("a0", "m", SHORT, now=0.0, tenant="a", since=0.0)
    q.push("b0", "m", SHORT, now=0.5, tenant="b")
    popped = q.pop(now=1.0)
    assert popped is not None and popped.item_id == "a0"
    q.push("a1", "m", SHORT, now=1.0, tenant="a")  # a0's place was free: a1 took it
    q.requeue(popped)  # no room after all: back in front, past max_depth, same deadline
    assert q.tenant_depth() == {"a": 2, "b": 1}
    again = q.pop(now=1.0)
    assert again is popped  # its turn was refunded: tenant a is still first
    assert _pop_ids(q, 2, now=1.0) == ["b0", "a1"]
    q.push("x", "m", SHORT, now=2.0, tenant="c")
    x = q.pop(now=2.0)
    assert x is not None
    q.requeue(x)
    with pytest.raises(CacheIndexError, match="already queued"):
        q.requeue(x)


def test_fair_state_is_dropped_when_a_tenant_leaves_and_weights_must_be_positive() -> None:
    q = AdmissionQueue()
    for t in ("a", "b", "c"):
        q.push(t, "m", SHORT, now=0.0, tenant=t)
    assert q.remove("b")
    _pop_ids(q, 2)
    assert len(q) == 0 and q.tenant_depth() == {}
    assert not q._tpass and not q._tstride and not q._in_bucket
    with pytest.raises(CacheIndexError, match="weight"):
        q.push("z", "m", SHORT, now=0.0, tenant="z", weight=0.0)


def test_pop_for_one_model_respects_tenant_fairness() -> None:
    q = AdmissionQueue()
    q.push("a-n", "n", SHORT, now=0.0, tenant="a")
    for i in range(3):
        q.push(f"a{i}", "m", SHORT, now=0.0, tenant="a")
    q.push("b0", "m", SHORT, now=0.1, tenant="b")
    assert _pop_ids(q, 1) == ["a-n"]  # oldest head of tenant a, any model
    assert [q.pop(now=0.0, model="m").item_id for _ in range(2)] == ["b0", "a0"]  # type: ignore[union-attr]
    assert q.waiting_for("m") == 2 and q.waiting_for("n") == 0
