"""The scrape cadence's pure decisions: no sockets, no sleeps, virtual time only."""

from __future__ import annotations

import itertools
import math

import pytest

from gateway.config import ReplicaConfig, ScoreLoopConfig
from gateway.replicas.cadence import (
    NEVER,
    Bounds,
    Budget,
    Observation,
    busy,
    due_at,
    moved,
    next_interval,
    surprised,
)
from gateway.replicas.state import ReplicaState
from vllm_api.metrics import VllmMetrics

B = Bounds.of(ScoreLoopConfig())
# Fast bounds in round numbers, with a budget that never binds: the cadence alone.
FREE = Bounds(fastest_s=0.25, steady_s=2.0, idle_s=5.0, max_per_s=1000.0)


def obs(
    at: float = 0.0,
    running: float | None = 0.0,
    waiting: float | None = 0.0,
    kv: float | None = 0.0,
    ours: int = 0,
) -> Observation:
    return Observation(at, running, waiting, kv, ours)


def test_defaults_bound_the_cadence_between_a_quarter_second_and_five() -> None:
    assert (B.fastest_s, B.steady_s, B.idle_s, B.max_per_s) == (0.25, 2.0, 5.0, 1.0)
    assert B.burst == 4.0


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        # A fastest bound above the others fixes the cadence (tests that want scrapes apart).
        (ScoreLoopConfig(scrape_interval_s=30.0), (30.0, 30.0, 30.0)),
        (ScoreLoopConfig(steady_scrape_interval_s=9.0), (0.25, 9.0, 9.0)),
        (ScoreLoopConfig(idle_scrape_interval_s=0.1), (0.25, 2.0, 2.0)),
    ],
)
def test_each_bound_is_at_least_the_one_before(
    cfg: ScoreLoopConfig, expected: tuple[float, float, float]
) -> None:
    b = Bounds.of(cfg)
    assert (b.fastest_s, b.steady_s, b.idle_s) == expected


@pytest.mark.parametrize(
    "key",
    ["steady_scrape_interval_s", "idle_scrape_interval_s", "max_scrapes_per_s"],
)
def test_cadence_keys_must_be_positive(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        ScoreLoopConfig(**{key: 0.0})  # type: ignore[arg-type]


def test_a_small_budget_still_allows_one_scrape_at_a_time() -> None:
    assert Bounds(0.25, 2.0, 5.0, max_per_s=0.1).burst == 1.0


def test_load_needs_both_gauges() -> None:
    assert obs(running=3.0, waiting=2.0).load == 5.0
    assert obs(running=None).load is None
    assert obs(waiting=None).load is None


@pytest.mark.parametrize(
    ("prev", "last", "expected"),
    [
        # Only the gateway's own requests: what it sent shows up on the replica.
        (obs(running=4.0, ours=4), obs(running=8.0, ours=8), False),
        (obs(running=8.0, ours=8), obs(running=2.0, ours=2), False),
        # Arrivals still queued (vLLM has not scheduled them yet) are ours too.
        (obs(running=4.0, ours=4), obs(running=4.0, waiting=4.0, ours=8), False),
        # Within the slack: one request, or a quarter of the load, on the wire or draining.
        (obs(running=0.0), obs(running=1.0), False),
        (obs(running=12.0, ours=12), obs(running=15.0, ours=12), False),
        (obs(running=12.0, ours=12), obs(running=9.0, ours=12), False),
        # Someone else's requests appeared, or went.
        (obs(running=0.0), obs(running=2.0), True),
        (obs(running=12.0, ours=4), obs(running=4.0, ours=4), True),
        # A queue beyond our arrivals (KV pressure: running requests were preempted).
        (obs(running=8.0, ours=8), obs(running=5.0, waiting=3.0, ours=8), True),
        # Unknown gauges cannot disagree.
        (obs(running=None), obs(running=9.0, ours=0), False),
        (obs(waiting=None), obs(waiting=None, running=0.0, ours=0), False),
    ],
)
def test_surprise_is_what_the_gateways_own_changes_do_not_explain(
    prev: Observation, last: Observation, expected: bool
) -> None:
    assert surprised(prev, last) is expected


def test_a_steady_foreign_load_stops_surprising_after_its_first_scrape() -> None:
    # Another client holds 6 requests throughout: the model (scraped + ours) carries them.
    first, second, third = obs(running=0.0), obs(running=6.0), obs(running=8.0, ours=2)
    assert surprised(first, second)
    assert not surprised(second, third)


@pytest.mark.parametrize(
    ("at_scrape", "now", "expected"),
    [(0, 1, False), (0, 2, True), (8, 5, False), (8, 4, True), (8, 12, True), (20, 14, False)],
)
def test_our_own_load_moving_beyond_the_slack(at_scrape: int, now: int, expected: bool) -> None:
    assert moved(obs(ours=at_scrape), now) is expected


@pytest.mark.parametrize(
    ("last", "now", "since_routed", "expected"),
    [
        (obs(), 0, math.inf, False),
        (obs(), 0, 10.0, False),
        (obs(), 0, 4.9, True),  # routed to within the idle interval
        (obs(), 1, math.inf, True),
        (obs(ours=1), 0, math.inf, True),  # ended since the scrape: its effects may not have
        (obs(running=2.0), 0, math.inf, True),  # someone else's work
        (obs(running=None, waiting=None), 0, math.inf, False),
    ],
)
def test_busy(last: Observation, now: int, since_routed: float, expected: bool) -> None:
    assert busy(B, last, now, since_routed) is expected


def test_the_first_scrape_of_a_replica_is_followed_soon() -> None:
    assert next_interval(FREE, None, obs(), 0.0, 0, math.inf) == 0.25


def test_agreement_doubles_the_interval_up_to_the_steady_ceiling_under_load() -> None:
    intervals, prev, last, interval = [], obs(running=8.0, ours=8), None, 0.25
    for i in range(1, 8):
        last = obs(at=float(i), running=8.0, ours=8)
        interval = next_interval(FREE, prev, last, interval, 8, 0.1)
        intervals.append(interval)
        prev = last
    assert intervals == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]


def test_an_idle_replica_backs_off_to_the_idle_ceiling() -> None:
    intervals, interval = [], 0.25
    for i in range(1, 7):
        interval = next_interval(FREE, obs(at=i - 1.0), obs(at=float(i)), interval, 0, math.inf)
        intervals.append(interval)
    assert intervals == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_idle_but_routed_to_lately_stays_at_the_steady_ceiling() -> None:
    assert next_interval(FREE, obs(), obs(at=1.0), 4.0, 0, since_routed_s=3.0) == 2.0
    assert next_interval(FREE, obs(), obs(at=1.0), 4.0, 0, since_routed_s=6.0) == 5.0


@pytest.mark.parametrize(
    ("prev", "last", "now"),
    [
        (obs(running=8.0, ours=8), obs(at=1.0, running=14.0, ours=8), 8),  # another client
        (obs(running=8.0, ours=8), obs(at=1.0, running=8.0, ours=8), 16),  # our burst
        (obs(running=8.0, ours=8), obs(at=1.0, running=8.0, ours=8), 0),  # everything ended
    ],
)
def test_disagreement_or_a_burst_of_ours_drops_to_the_fastest(
    prev: Observation, last: Observation, now: int
) -> None:
    assert next_interval(FREE, prev, last, 2.0, now, 0.1) == 0.25


@pytest.mark.parametrize(
    ("kv_rate", "expected"),
    [(0.0, 2.0), (0.01, 2.0), (0.05, 2.0), (0.1, 1.0), (0.2, 0.5), (5.0, 0.25)],
)
def test_kv_usage_moving_fast_shortens_the_interval(kv_rate: float, expected: float) -> None:
    # At most a tenth of the cache between two scrapes; never faster than the fastest bound.
    prev = obs(at=10.0, running=4.0, kv=0.2, ours=4)
    last = obs(at=12.0, running=4.0, kv=0.2 + 2.0 * kv_rate, ours=4)
    assert next_interval(FREE, prev, last, 2.0, 4, 0.1) == pytest.approx(expected)


def test_unknown_kv_usage_or_no_time_between_scrapes_leaves_the_interval() -> None:
    assert next_interval(FREE, obs(kv=None), obs(at=1.0, kv=0.9), 1.0, 0, math.inf) == 2.0
    assert next_interval(FREE, obs(kv=0.1), obs(at=0.0, kv=0.9), 1.0, 0, math.inf) == 2.0


def test_a_fixed_cadence_whatever_the_replica_does() -> None:
    fixed = Bounds.of(ScoreLoopConfig(scrape_interval_s=30.0))
    for prev in (None, obs(), obs(running=50.0)):
        assert next_interval(fixed, prev, obs(at=1.0), 30.0, 0, math.inf) == 30.0


def test_the_budget_holds_whatever_the_cadence_asks() -> None:
    # A cadence that wants a scrape every 10 ms for 60 s: the bucket allows 4 + 1/s.
    bounds = Bounds(0.01, 0.01, 0.01, max_per_s=1.0)
    budget, t, starts = Budget.full(bounds, 0.0), 0.0, list[float]()
    while t < 60.0:
        t = due_at(bounds, t, 0.01, budget, starts[-1] if starts else NEVER, t)
        budget = budget.spend(bounds, t)
        starts.append(t)
    for window in (1.0, 4.0, 10.0, 30.0):
        worst = max(sum(1 for s in starts if a <= s < a + window) for a in starts)
        assert worst <= bounds.burst + bounds.max_per_s * window, window
    # After the burst, evenly at the sustained rate: no gaps of silence.
    gaps = [b - a for a, b in itertools.pairwise(starts[5:])]
    assert max(gaps) == pytest.approx(1.0) and min(gaps) == pytest.approx(1.0)


def test_budget_refills_up_to_its_burst() -> None:
    budget = Budget(0.0, 10.0)
    assert budget.ready_at(B, 10.0) == pytest.approx(11.0)
    assert budget.ready_at(B, 10.5) == pytest.approx(11.0)
    assert budget.ready_at(B, 12.0) == 12.0
    assert budget.spend(B, 100.0) == Budget(3.0, 100.0)  # full (4), less this one


def test_never_two_attempts_closer_than_the_fastest_bound() -> None:
    budget = Budget.full(B, 0.0)
    assert due_at(B, 0.0, 0.0, budget, last_attempt=5.0, now=5.0) == 5.25
    assert due_at(B, 5.0, 2.0, budget, last_attempt=5.0, now=5.0) == 7.0
    assert due_at(B, 5.0, 2.0, Budget(0.0, 6.9), last_attempt=5.0, now=6.9) == pytest.approx(7.9)


def _scrape_rate(bounds: Bounds, replica_load: list[float], ours: list[int]) -> float:
    """Scrapes per second over a replay of one-second samples of a replica's load."""
    budget, prev, last, interval = Budget.full(bounds, 0.0), None, None, 0.0
    t, n, attempt = 0.0, 0, NEVER
    while t < len(replica_load) - 1:
        i = int(t)
        prev, last = last, obs(at=t, running=replica_load[i], ours=ours[i])
        interval = next_interval(bounds, prev, last, interval, ours[i], 0.0 if ours[i] else 60.0)
        t = due_at(bounds, t, interval, budget, attempt, t)
        budget, attempt, n = budget.spend(bounds, t), t, n + 1
    return n / (len(replica_load) - 1)


def test_defaults_scrape_at_least_five_times_less_than_ten_a_second() -> None:
    seconds = 600
    # Steady load of the gateway's own requests (8-10 running): every 2 s, 20x fewer.
    steady = [8.0 + (i % 3) for i in range(seconds)]
    assert 10.0 / _scrape_rate(B, steady, [int(x) for x in steady]) >= 19.0
    # Another client moving the load all the time: the budget's sustained 1/s, 10x fewer.
    foreign = [float((i * 7) % 13) for i in range(seconds)]
    assert 10.0 / _scrape_rate(B, foreign, [0] * seconds) >= 9.9
    # Idle: every 5 s, 50x fewer (less the start-up's back-off).
    assert 10.0 / _scrape_rate(B, [0.0] * seconds, [0] * seconds) >= 45.0


def _replica(interval_s: float) -> ReplicaState:
    r = ReplicaState(ReplicaConfig(url="http://r0.test:8000", name="r0"))
    r.metrics, r.scraped_at, r.scrape_interval_s = VllmMetrics(running=1.0), 100.0, interval_s
    return r


@pytest.mark.parametrize(
    ("interval_s", "now", "expected"),
    [
        # Scraped every 2 s under steady load: fresh right up to the next scrape and beyond.
        (2.0, 101.9, 1.0),
        (2.0, 103.0, 1.0),  # a scrape 1 s late (stale_after_s) is still trusted
        (2.0, 105.0, 0.5),  # 3 s late: halfway down the 4 s span
        (2.0, 107.0, 0.0),
        (5.0, 105.9, 1.0),  # idle, scraped every 5 s
        # No plan (ReplicaState outside a score loop): the plain age, as always.
        (0.0, 100.9, 1.0),
        (0.0, 103.0, 0.5),
    ],
)
def test_freshness_counts_lateness_past_the_planned_scrape(
    interval_s: float, now: float, expected: float
) -> None:
    assert _replica(interval_s).freshness(now) == pytest.approx(expected)
