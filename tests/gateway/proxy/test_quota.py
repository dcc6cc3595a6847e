"""Quotas: reserve-then-settle token budgets, requests per minute, concurrency, usage reading."""

from __future__ import annotations

import asyncio

import pytest

from gateway.proxy.quota import Limits, LocalQuotaStore, QuotaStore
from gateway.proxy.usage import usage_tokens

TPM = Limits(tokens_per_minute=1000)


async def test_a_burst_of_concurrent_reservations_cannot_exceed_tokens_per_minute() -> None:
    store: QuotaStore = LocalQuotaStore()
    # Ten at once, none settled yet: each counts against the budget while it is in flight.
    results = await asyncio.gather(*(store.reserve("t", TPM, 300, now=0.0) for _ in range(10)))
    granted = [r for r in results if r is None]
    assert len(granted) == 3  # 3 x 300 <= 1000 < 4 x 300
    refusals = [r for r in results if r is not None]
    assert {r.limit for r in refusals} == {"tokens_per_minute"}
    # 100 tokens left, 200 missing at 1000 / 60 s: 12 s until the next one fits.
    assert refusals[0].retry_after_s == pytest.approx(12.0)


def test_settle_replaces_the_reservation_with_the_real_usage() -> None:
    store = LocalQuotaStore()
    assert store.reserve_now("t", TPM, 600, now=0.0) is None
    assert store.reserve_now("t", TPM, 600, now=0.0) is not None  # 400 left
    store.settle("t", TPM, reserved=600, used=50, now=0.0)  # it used far less
    assert store.reserve_now("t", TPM, 600, now=0.0) is None  # 950 left: fits
    assert store.in_flight("t") == 1


def test_unknown_usage_keeps_the_reservation_and_overuse_is_debt() -> None:
    store = LocalQuotaStore()
    store.reserve_now("t", TPM, 500, now=0.0)
    store.settle("t", TPM, reserved=500, used=None, now=0.0)  # no usage chunk: 500 stay spent
    refusal = store.reserve_now("t", TPM, 501, now=0.0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(0.06)
    store.reserve_now("t", TPM, 100, now=0.0)
    store.settle("t", TPM, reserved=100, used=900, now=0.0)  # used 800 more than reserved
    refusal = store.reserve_now("t", TPM, 100, now=0.0)
    assert refusal is not None  # 500 - 900 = -400 left: 500 missing, 30 s at 1000/min
    assert refusal.retry_after_s == pytest.approx(30.0)
    assert store.reserve_now("t", TPM, 100, now=30.0) is None


def test_a_request_larger_than_the_whole_budget_runs_once_the_budget_is_full() -> None:
    store = LocalQuotaStore()
    assert store.reserve_now("t", TPM, 5000, now=0.0) is None
    store.settle("t", TPM, reserved=5000, used=0, now=0.0)  # refunded: the budget is full again
    assert store.reserve_now("t", TPM, 1, now=0.0) is None


def test_requests_per_minute_refill_continuously() -> None:
    store = LocalQuotaStore()
    rpm = Limits(requests_per_minute=2)
    assert store.reserve_now("t", rpm, 0, now=0.0) is None
    assert store.reserve_now("t", rpm, 0, now=0.0) is None
    refusal = store.reserve_now("t", rpm, 0, now=0.0)
    assert refusal is not None and refusal.limit == "requests_per_minute"
    assert refusal.retry_after_s == pytest.approx(30.0)
    assert store.reserve_now("t", rpm, 0, now=29.0) is not None
    assert store.reserve_now("t", rpm, 0, now=30.0) is None
    # Another tenant has its own budget.
    assert store.reserve_now("u", rpm, 0, now=0.0) is None


def test_concurrency_counts_until_settled_and_a_refusal_takes_nothing() -> None:
    store = LocalQuotaStore()
    limits = Limits(max_concurrent=1, tokens_per_minute=1000)
    assert store.reserve_now("t", limits, 900, now=0.0) is None
    refusal = store.reserve_now("t", limits, 10, now=0.0)
    assert refusal is not None and refusal.limit == "max_concurrent"
    store.settle("t", limits, reserved=900, used=900, now=0.0)
    assert store.in_flight("t") == 0
    # Too many tokens now: refused by tokens, and no concurrency slot was taken for it.
    refusal = store.reserve_now("t", limits, 200, now=0.0)
    assert refusal is not None and refusal.limit == "tokens_per_minute"
    assert store.in_flight("t") == 0


@pytest.mark.parametrize(
    ("data", "tokens"),
    [
        # A streamed usage chunk (chat), and one with details and spaces.
        (
            b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":12,"total_tokens":20,'
            b'"completion_tokens":8}}\n\ndata: [DONE]\n\n',
            20,
        ),
        (
            b'{"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}, '
            b'"completion_tokens": 4}}',
            7,
        ),
        # Completion chunks carry "usage":null; the last real usage object counts.
        (b'data: {"choices":[{"text":"a"}],"usage":null}\n\n', None),
        (b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2},"x":{"usage":null}}', 3),
        # Generated text that quotes a usage object is escaped: never read as usage.
        (b'{"choices":[{"text":"\\"usage\\":{\\"prompt_tokens\\":9}"}],"usage":null}', None),
        # A pooling route's usage: prompt tokens only, its whole charge.
        (b'{"usage":{"prompt_tokens":5}}', 5),
        (b"", None),
    ],
)
def test_usage_tokens(data: bytes, tokens: int | None) -> None:
    assert usage_tokens(data) == tokens
