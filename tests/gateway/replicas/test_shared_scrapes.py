"""The score loop's side of one scraper per replica: other processes' results applied as if
scraped here, the budget whole while shared, and no scrape of a replica another one owns."""

from __future__ import annotations

import asyncio
from typing import cast

import aiohttp

from gateway.config import ReplicaConfig, ScoreLoopConfig
from gateway.replicas.score_loop import ScoreLoop
from gateway.replicas.state import ReplicaState
from tests.gateway.conftest import eventually
from vllm_api.metrics import VllmMetrics


class _Refused:
    """A session whose every GET fails as a refused connection would."""

    def get(self, url: str, **_: object) -> None:
        raise aiohttp.ClientConnectionError(f"refused: {url}")


class _Share:
    """Which replicas this process scrapes, as the scrape leases would answer (settable)."""

    def __init__(self, sharing: bool, owned: set[str]) -> None:
        self.shared, self.owned = sharing, owned
        self.asked = 0
        self.published: list[tuple[str, int, float, VllmMetrics]] = []

    def sharing(self, now: float) -> bool:
        return self.shared

    def scrapes(self, replica: str, now: float) -> bool:
        self.asked += 1
        return not self.shared or replica in self.owned

    def publish(self, replica: str, version_us: int, interval_s: float, m: VllmMetrics) -> None:
        self.published.append((replica, version_us, interval_s, m))


def _loop(share: _Share, cfg: ScoreLoopConfig | None = None, workers: int = 1) -> ScoreLoop:
    session = cast(aiohttp.ClientSession, _Refused())
    return ScoreLoop(
        cfg or ScoreLoopConfig(), session, lambda _n, _b: None, workers=workers, share=share
    )


def _replica() -> ReplicaState:
    return ReplicaState(ReplicaConfig(url="http://r0.test:8000", name="r0"))


def test_a_result_from_another_process_is_applied_against_this_ones_in_flight() -> None:
    loop, r = _loop(_Share(True, set())), _replica()
    r.in_flight = 3
    assert loop.apply_remote(r, 1_000, 0.5, VllmMetrics(running=5.0, waiting=0.0))
    assert r.in_flight_at_scrape == 3 and r.metrics is not None and r.metrics.running == 5.0
    # Its next scrape is where the scraper planned it: freshness counts lateness from there.
    assert r.scrape_interval_s == 0.5 and r.freshness(r.scraped_at + 1.5) == 1.0
    assert r.freshness(r.scraped_at + 2.0) < 1.0
    # Ours since: two more arrivals queue on top of the scraped load, as after a scrape here.
    r.in_flight = 5
    snap = r.snapshot(r.scraped_at + 0.1)
    assert (snap.running, snap.waiting) == (5.0, 2.0)
    assert r.scrapes_total == 0  # nothing was sent from here


def test_an_older_result_never_replaces_a_newer_one() -> None:
    loop, r = _loop(_Share(True, set())), _replica()
    assert loop.apply_remote(r, 2_000, 0.5, VllmMetrics(running=2.0))
    assert not loop.apply_remote(r, 1_000, 0.5, VllmMetrics(running=9.0))
    assert not loop.apply_remote(r, 2_000, 0.5, VllmMetrics(running=9.0))
    assert r.metrics is not None and r.metrics.running == 2.0


def test_the_budget_is_whole_while_shared_and_split_by_the_hosts_workers_otherwise() -> None:
    share = _Share(True, set())
    loop = _loop(share, ScoreLoopConfig(max_scrapes_per_s=4.0), workers=2)
    assert loop._bounds.max_per_s == 4.0
    share.shared = False  # Redis down: each worker scrapes on its own, its share of it
    assert loop._bounds.max_per_s == 2.0


def test_another_processs_requests_are_the_gateways_own_load_not_a_surprise() -> None:
    for remote, expected in ((4, 0.5), (0, 0.25)):
        loop, r = _loop(_Share(False, set())), _replica()
        loop.record(r, VllmMetrics(running=0.0, waiting=0.0), 10.0)
        loop.due(r, 10.0)
        r.requests_total = 1  # routed lately: the steady ceiling
        r.remote_in_flight = remote
        loop.record(r, VllmMetrics(running=4.0, waiting=0.0), 10.25)
        # Counted by the in-flight poll: the cadence backs off; unexplained: it stays fast.
        assert r.scrape_interval_s == expected, remote


async def test_a_replica_another_process_owns_is_not_scraped_until_this_one_owns_it() -> None:
    share = _Share(True, set())
    loop, r = _loop(share, ScoreLoopConfig(scrape_interval_s=0.01)), _replica()
    task = asyncio.create_task(loop.run(r))
    try:
        await eventually(lambda: share.asked >= 5, what="the loop asked a few times")
        assert r.scrapes_total == 0
        share.owned.add("r0")
        await eventually(lambda: r.scrapes_total >= 1, what="scraped once owned")
        share.owned.clear()
        share.shared = False  # nobody shares: it scrapes on its own again
        seen = r.scrapes_total
        await eventually(lambda: r.scrapes_total > seen, what="scraped alone")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
