"""The score loop's cadence bookkeeping per replica, driven without sockets or sleeps."""

from __future__ import annotations

import time
from typing import cast

import aiohttp
import pytest

from gateway.config import ReplicaConfig, ScoreLoopConfig
from gateway.replicas.score_loop import ScoreLoop
from gateway.replicas.state import ReplicaState
from vllm_api.metrics import VllmMetrics

IDLE = VllmMetrics(running=0.0, waiting=0.0, kv_usage=0.0, requests_ok=10.0)


class _Refused:
    """A session whose every GET fails as a refused connection would."""

    def get(self, url: str, **_: object) -> None:
        raise aiohttp.ClientConnectionError(f"refused: {url}")


def _loop(cfg: ScoreLoopConfig | None = None) -> ScoreLoop:
    return ScoreLoop(
        cfg or ScoreLoopConfig(), cast(aiohttp.ClientSession, _Refused()), lambda _n, _b: None
    )


def _replica() -> ReplicaState:
    return ReplicaState(ReplicaConfig(url="http://r0.test:8000", name="r0"))


def _idle_until(loop: ScoreLoop, r: ReplicaState, t: float, until_s: float) -> float:
    """Scrapes of an idle replica, each at the time the loop asked for, up to `until_s`."""
    while t < until_s:
        loop.record(r, IDLE, t)
        t = loop.due(r, t)
    return t


def test_an_idle_replica_backs_off_and_its_interval_is_on_its_state() -> None:
    loop, r = _loop(), _replica()
    loop.record(r, IDLE, 100.0)
    seen = [r.scrape_interval_s]
    t = 100.0
    for _ in range(6):
        t = loop.due(r, t)
        loop.record(r, IDLE, t)
        seen.append(r.scrape_interval_s)
    assert seen == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    # Fresh all along: data the loop chose not to refresh keeps its trust.
    assert r.freshness(t + 5.0) == 1.0


def test_requests_routed_between_scrapes_bring_the_next_one_forward() -> None:
    loop, r = _loop(), _replica()
    t = _idle_until(loop, r, 0.0, 30.0)
    scraped = r.scraped_at
    assert loop.due(r, scraped + 1.0) == scraped + 5.0
    # One short request came and went: routed lately, so the steady ceiling (2 s).
    r.requests_total += 1
    assert loop.due(r, scraped + 1.0) == scraped + 2.0
    assert r.scrape_interval_s == 2.0
    # A burst of ours: scrape now; lateness counts from now, the values stay trusted.
    r.in_flight = 6
    now = scraped + 1.5
    assert loop.due(r, now) == now
    assert r.scrape_interval_s == pytest.approx(1.5) and r.freshness(now) == 1.0
    # The plan is never pushed back before the next scrape, whatever happens.
    r.in_flight = 0
    assert loop.due(r, now + 0.1) == now + 0.1
    assert r.scrape_interval_s == pytest.approx(1.5)
    assert t == scraped + 5.0


def test_a_replica_other_clients_load_is_scraped_fast_until_the_budget_binds() -> None:
    loop, r = _loop(), _replica()
    t = _idle_until(loop, r, 0.0, 30.0)
    gaps = []
    for i in range(12):
        # Someone else's requests: 5, 0, 5, 0... while the gateway sends none.
        loop.record(r, VllmMetrics(running=5.0 * ((i + 1) % 2), waiting=0.0), t)
        nxt = loop.due(r, t)
        gaps.append(round(nxt - t, 6))
        # The loop spends the budget on each attempt (scrape() does this before its GET).
        pace = loop._paces[r.name]
        pace.budget, pace.last_attempt = pace.budget.spend(loop._bounds, nxt), nxt
        t = nxt
    # The bucket's burst (4 scrapes, and what refilled meanwhile), then 1 a second.
    assert gaps[:5] == [0.25] * 5
    assert set(gaps[-6:]) == {1.0}


async def test_a_failed_scrape_keeps_the_plan_and_retries_no_faster_than_the_bound() -> None:
    loop, r = _loop(), _replica()
    start = time.monotonic() - 60.0  # the loop's clock: scrape() reads it
    _idle_until(loop, r, start, start + 30.0)
    planned = r.scrape_interval_s
    assert not await loop.scrape(r)
    assert (r.scrapes_total, r.scrape_errors) == (1, 1)
    assert r.scrape_interval_s == planned  # lateness keeps counting from the same plan
    attempt = loop._paces[r.name].last_attempt
    assert loop.due(r, attempt) == pytest.approx(attempt + 0.25)


def test_a_restarted_replica_is_followed_closely_again() -> None:
    loop, r = _loop(), _replica()
    t = _idle_until(loop, r, 0.0, 30.0)
    assert r.scrape_interval_s == 5.0
    loop.record(r, VllmMetrics(running=0.0, waiting=0.0, requests_ok=1.0), t)
    assert r.scrape_interval_s == 0.25


def test_a_fixed_cadence_when_the_fastest_bound_is_the_slowest() -> None:
    loop, r = _loop(ScoreLoopConfig(scrape_interval_s=30.0)), _replica()
    loop.record(r, IDLE, 0.0)
    r.in_flight = 40
    assert loop.due(r, 1.0) == 30.0
