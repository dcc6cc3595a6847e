"""Tier 3 admission queue: buckets, short-first, starvation-freedom, expiry, full, removal."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cache_index.admission_queue import AdmissionQueue, QueueFull, bucket_names, bucket_of
from cache_index.errors import CacheIndexError

# The default limits (128, 512): the buckets of a 50-, 300- and 2000-token prompt.
SHORT, MID, LONG = "le128", "le512", "gt512"


@pytest.mark.parametrize(
    ("limits", "tokens", "expected"),
    [
        ((128, 512), 0, "le128"),
        ((128, 512), 128, "le128"),
        ((128, 512), 129, "le512"),
        ((128, 512), 512, "le512"),
        ((128, 512), 513, "gt512"),
        ((64,), 65, "gt64"),
        ((), 10_000, "all"),
    ],
)
def test_bucket_of(limits: tuple[int, ...], tokens: int, expected: str) -> None:
    q = AdmissionQueue(buckets=limits)
    assert bucket_of(limits, tokens) == expected
    assert q.names == bucket_names(limits)
    assert q.push("t", "m", expected, now=0.0).bucket == expected
    assert q.depth()[("m", expected)] == 1


def test_the_bucket_is_taken_as_named_and_must_be_one_of_the_queues() -> None:
    assert [bucket_of((128, 512), t) for t in (50, 300, 2000)] == [SHORT, MID, LONG]
    q = AdmissionQueue(buckets=(64,))
    with pytest.raises(CacheIndexError, match="unknown bucket 'le128'"):
        q.push("a", "m", "le128", now=0.0)
    with pytest.raises(CacheIndexError, match="unknown bucket ''"):
        q.push("a", "m", "", now=0.0)
    assert len(q) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"buckets": (512, 128)},
        {"buckets": (0, 128)},
        {"max_depth": 0},
        {"max_wait_s": 0.0},
        {"long_share": 0.0},
        {"long_share": 0.6},
    ],
)
def test_rejects_bad_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(CacheIndexError):
        AdmissionQueue(**kwargs)  # type: ignore[arg-type]


def drain(q: AdmissionQueue, now: float) -> list[str]:
    out = []
    while (t := q.pop(now)) is not None:
        out.append(t.item_id)
    return out


def test_fifo_within_a_bucket_across_models() -> None:
    q = AdmissionQueue()
    for i, model in enumerate(["a", "b", "a", "b"]):
        q.push(f"t{i}", model, SHORT, now=float(i) * 0.01)
    assert drain(q, now=0.1) == ["t0", "t1", "t2", "t3"]


def test_short_requests_go_before_long_ones_that_arrived_earlier() -> None:
    q = AdmissionQueue()
    for i in range(3):
        q.push(f"long{i}", "m", LONG, now=0.0)
    for i in range(3):
        q.push(f"short{i}", "m", SHORT, now=0.1)
    assert drain(q, now=0.2)[:3] == ["short0", "short1", "short2"]


@pytest.mark.parametrize(("long_share", "expected_long"), [(0.2, 20), (0.5, 50), (0.1, 10)])
def test_backlogged_long_bucket_gets_its_share(long_share: float, expected_long: int) -> None:
    q = AdmissionQueue(buckets=(128,), long_share=long_share, max_depth=200)
    for i in range(150):
        q.push(f"s{i}", "m", SHORT, now=0.0)
        q.push(f"l{i}", "m", "gt128", now=0.0)
    popped = [q.pop(now=1.0) for _ in range(100)]
    served = Counter(t.bucket for t in popped if t is not None)
    assert abs(served["gt128"] - expected_long) <= 1


def test_three_buckets_are_ordered_by_share() -> None:
    q = AdmissionQueue(max_depth=500)
    for i in range(400):
        for tokens in (SHORT, MID, LONG):
            q.push(f"{tokens}-{i}", "m", tokens, now=0.0)
    served = Counter(t.bucket for _ in range(400) if (t := q.pop(now=1.0)) is not None)
    assert served["le128"] > served["le512"] > served["gt512"] > 0


def test_long_requests_are_not_starved_by_a_steady_short_stream() -> None:
    rng = random.Random(3)
    q = AdmissionQueue(max_wait_s=30.0, max_depth=100_000)
    for i in range(20):
        q.push(f"long{i}", "m", LONG, now=0.0)
    now, n, waits = 0.0, 0, {}
    while any(f"long{i}" in q for i in range(20)):
        now += 0.05
        for _ in range(rng.randint(1, 3)):  # arrivals outpace dispatch: shorts always waiting
            q.push(f"s{n}", "m", SHORT, now=now)
            n += 1
        t = q.pop(now)
        assert t is not None
        if t.item_id.startswith("long"):
            waits[t.item_id] = now - t.enqueued_at
        assert not [x for x in q.expire(now) if x.item_id.startswith("long")]
    assert len(waits) == 20
    assert max(waits.values()) < 30.0


def test_a_ticket_past_the_aging_threshold_goes_first() -> None:
    q = AdmissionQueue(max_wait_s=30.0, age_first_s=5.0)
    q.push("long", "m", LONG, now=0.0)
    for i in range(10):
        q.push(f"s{i}", "m", SHORT, now=4.0)
    assert q.pop(now=4.9).item_id == "s0"  # type: ignore[union-attr]
    assert q.pop(now=5.0).item_id == "long"  # type: ignore[union-attr]


def test_an_idle_bucket_banks_no_credit() -> None:
    q = AdmissionQueue(max_depth=1000)
    for i in range(200):
        q.push(f"s{i}", "m", SHORT, now=0.0)
        q.pop(now=0.0)
    for i in range(50):
        q.push(f"a{i}", "m", SHORT, now=0.0)
        q.push(f"l{i}", "m", LONG, now=0.0)
    first = [q.pop(now=0.0).bucket for _ in range(10)]  # type: ignore[union-attr]
    assert first.count("gt512") <= 2


def test_expire_returns_tickets_past_their_deadline_in_order() -> None:
    q = AdmissionQueue(max_wait_s=10.0)
    q.push("a", "m", LONG, now=0.0)
    q.push("b", "m", SHORT, now=1.0)
    q.push("c", "n", SHORT, now=2.0)
    q.push("d", "m", SHORT, now=5.0)
    assert [t.item_id for t in q.expire(now=9.9)] == []
    assert [t.item_id for t in q.expire(now=12.0)] == ["a", "b", "c"]
    assert len(q) == 1
    assert q.depth()[("m", "le128")] == 1
    assert q.pop(now=12.0).item_id == "d"  # type: ignore[union-attr]


def test_full_queue_raises_with_a_retry_hint_per_model_and_bucket() -> None:
    q = AdmissionQueue(max_depth=2, max_wait_s=20.0)
    q.push("a", "m", SHORT, now=0.0)
    q.push("b", "m", SHORT, now=0.0)
    with pytest.raises(QueueFull) as info:
        q.push("c", "m", SHORT, now=0.0)
    assert (info.value.model, info.value.bucket) == ("m", "le128")
    assert 1.0 <= info.value.retry_after_s <= 20.0
    q.push("c", "m", LONG, now=0.0)
    q.push("d", "other", SHORT, now=0.0)


def test_retry_after_follows_the_dispatch_rate() -> None:
    q = AdmissionQueue(max_depth=100, max_wait_s=30.0)
    assert q.retry_after_s(now=0.0) == 30.0
    for i in range(30):
        q.push(f"t{i}", "m", SHORT, now=0.0)
    for i in range(10):
        q.pop(now=0.1 * i)  # 10 dispatches over one second
    assert q.retry_after_s(now=1.0) == pytest.approx(21 / 10)


def test_remove_drops_a_ticket_and_keeps_dead_entries_bounded() -> None:
    q = AdmissionQueue(max_depth=10)
    q.push("keep", "m", SHORT, now=0.0)
    for i in range(1000):
        q.push(f"gone{i}", "m", SHORT, now=0.0)
        assert q.remove(f"gone{i}")
    assert not q.remove("gone0")
    assert q.depth()[("m", "le128")] == 1
    # One queue per (model, bucket, class, tenant): the default class and tenant here.
    assert len(q._queues[("m", 0, 0, "")]) <= 2 * 1 + 17
    assert drain(q, now=0.0) == ["keep"]


def test_pop_for_one_model_and_depth_reports_zeros() -> None:
    q = AdmissionQueue()
    q.push("a", "m", SHORT, now=0.0)
    q.push("b", "n", LONG, now=0.0)
    assert q.pop(now=0.0, model="n").item_id == "b"  # type: ignore[union-attr]
    assert q.pop(now=0.0, model="n") is None
    assert q.depth() == {
        ("m", "le128"): 1,
        ("m", "le512"): 0,
        ("m", "gt512"): 0,
        ("n", "le128"): 0,
        ("n", "le512"): 0,
        ("n", "gt512"): 0,
    }


def test_duplicate_ticket_id_is_rejected() -> None:
    q = AdmissionQueue()
    q.push("a", "m", SHORT, now=0.0)
    with pytest.raises(CacheIndexError):
        q.push("a", "m", LONG, now=0.0)
