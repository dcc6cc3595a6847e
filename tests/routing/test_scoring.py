from __future__ import annotations

import random
from collections import Counter

import pytest

from routing.scoring import (
    NEUTRAL,
    choose,
    load,
    mem_frac,
    near_best,
    relative,
    settle,
    undercut,
)
from tests.routing.replicas import replica


@pytest.mark.parametrize(
    ("values", "fresh", "expected"),
    [
        ([0.2, 0.8], [1.0, 1.0], [0.2, 0.8]),
        ([0.2, None, 0.8], [1.0, 1.0, 1.0], [0.2, 0.5, 0.8]),
        ([0.9, None], [1.0, 1.0], [0.9, 0.9]),
        ([None, None], [1.0, 1.0], [NEUTRAL, NEUTRAL]),
        # Half-stale pulls halfway toward the mean of the known values (0.5).
        ([0.0, 1.0], [0.5, 1.0], [0.25, 1.0]),
        ([0.0, 1.0], [0.0, 0.0], [0.5, 0.5]),
        ([0.0, 1.0], [-1.0, 2.0], [0.5, 1.0]),
    ],
)
def test_settle(values: list[float | None], fresh: list[float], expected: list[float]) -> None:
    reps = [replica(f"r{i}", freshness=f) for i, f in enumerate(fresh)]
    assert settle(values, reps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("gpu", "kv", "expected"),
    [(0.9, 0.3, 0.9), (None, 0.3, 0.3), (None, None, None), (0.0, 0.7, 0.0)],
)
def test_mem_frac_prefers_nvml(gpu: float | None, kv: float | None, expected: float | None) -> None:
    assert mem_frac(replica("r", gpu_mem_used_frac=gpu, kv_usage=kv)) == expected


@pytest.mark.parametrize(
    ("values", "unit", "expected"),
    [
        ([0.0], 1.0, [1.0]),
        ([4.0, 4.0], 1.0, [1.0, 1.0]),
        ([0.0, 1.0, 3.0], 1.0, [1.0, 0.75, 0.25]),
        ([0.0, 100.0], 100.0, [1.0, 0.5]),
        ([10.0, 0.0], 1000.0, [1 - 10 / 1010, 1.0]),
    ],
)
def test_relative(values: list[float], unit: float, expected: list[float]) -> None:
    assert relative(values, unit) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("in_flight", "running", "waiting", "expected"),
    [
        (5, None, None, 5.0),
        (5, 3.0, None, 5.0),
        (5, None, 1.0, 5.0),
        (5, 2.0, 1.0, 5.0),  # a burst since the scrape
        (5, 20.0, 4.0, 24.0),  # other clients' requests
    ],
)
def test_load(
    in_flight: int, running: float | None, waiting: float | None, expected: float
) -> None:
    assert load(replica("r", in_flight=in_flight, running=running, waiting=waiting)) == expected


@pytest.mark.parametrize(
    ("values", "epsilon", "among", "expected"),
    [
        ([0.1, 0.9, 0.5], 1e-9, None, [1]),
        ([0.9, 0.2, 0.9], 1e-9, None, [0, 2]),
        ([0.1 + 0.2, 0.3, 0.0], 1e-9, None, [0, 1]),  # float rounding stays a tie
        ([0.1 + 0.2, 0.3, 0.0], 0.0, None, [0]),
        ([5.0, 4.5, 3.0], 1.0, None, [0, 1]),
        # `among` bounds both the best and the answer, in its own order.
        ([9.0, 1.0, 2.0, 2.0], 1e-9, [3, 1, 2], [3, 2]),
        ([-3.0, -1.0, -1.5], 0.5, None, [1, 2]),
    ],
)
def test_near_best(
    values: list[float], epsilon: float, among: list[int] | None, expected: list[int]
) -> None:
    assert near_best(values, epsilon, among) == expected


def test_choose_draws_nothing_for_a_unique_best() -> None:
    rng = random.Random(5)
    state = rng.getstate()
    assert choose(rng, [3]) == 3
    assert rng.getstate() == state


def test_choose_is_the_seeded_draw_the_pickers_always_made() -> None:
    # The pickers' old inline tie-break, on the same seed: the same sequence.
    tied = [4, 1, 7]
    old, new = random.Random(11), random.Random(11)
    expected = [tied[old.randrange(len(tied))] for _ in range(50)]
    assert [choose(new, tied) for _ in range(50)] == expected
    counts = Counter(choose(random.Random(i), tied) for i in range(3000))
    assert set(counts) == set(tied) and min(counts.values()) > 850, counts


def _undercut(held_at: list[int], loads: list[float]) -> bool:
    """undercut for replica 0 at slack 1; held_at: blocks each replica holds."""
    return undercut(loads, 0, 1.0, held_at.__getitem__)


def test_undercut_needs_a_holder_with_as_much_and_more_than_slack_fewer_requests() -> None:
    # held_at: blocks each replica holds; loads: requests in flight; replica 0 is the affinity.
    assert _undercut([4, 4, 0], [3.0, 1.0, 0.0])
    assert not _undercut([4, 4, 0], [2.0, 1.0, 0.0])  # lighter by the slack only
    assert not _undercut([4, 3, 0], [9.0, 0.0, 0.0])  # holds less of the prompt
    assert _undercut([4, 6, 0], [3.0, 1.0, 0.0])  # holds more
    # Nothing held at the affinity replica: only a holder of some of it undercuts, never an
    # idle replica that holds nothing (that is outheld's call).
    assert not _undercut([0, 0, 0], [5.0, 0.0, 0.0])
    assert _undercut([0, 1, 0], [5.0, 0.0, 0.0])


def test_undercut_reads_no_match_while_no_replica_is_lighter_by_more_than_the_slack() -> None:
    read: list[int] = []

    def held_at(j: int) -> int:
        read.append(j)
        return 4

    assert not undercut([2.0, 1.0, 2.0], 0, 1.0, held_at)
    assert read == []
