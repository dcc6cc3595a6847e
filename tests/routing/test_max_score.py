from __future__ import annotations

from collections import Counter

import pytest

from routing import PLUGINS
from tests.routing.replicas import REQUEST, replica

REPS = [replica(n) for n in "abcd"]


@pytest.mark.parametrize(
    ("totals", "index"),
    [
        ([0.1, 0.9, 0.5, 0.2], 1),
        ([1.2, 0.0, 0.0, 0.0], 0),
        ([0.0, 0.0, 0.0, 1e-6], 3),
        ([-1.0, -0.5, -3.0, -2.0], 1),
    ],
)
def test_max_score_picks_the_unique_best(totals: list[float], index: int) -> None:
    pick = PLUGINS["max_score"].build({"seed": 0}).pick(REQUEST, REPS, totals)
    assert (pick.index, pick.branch) == (index, "max_score")


@pytest.mark.parametrize(
    ("totals", "tied"),
    [
        ([1.0, 1.0, 1.0, 1.0], {0, 1, 2, 3}),
        ([0.2, 0.9, 0.9, 0.1], {1, 2}),
        # 0.1 + 0.2 != 0.3 in floats; the epsilon keeps them tied.
        ([0.1 + 0.2, 0.3, 0.0, 0.0], {0, 1}),
    ],
)
def test_max_score_breaks_ties_uniformly(totals: list[float], tied: set[int]) -> None:
    picker = PLUGINS["max_score"].build({"seed": 42})
    picks = [picker.pick(REQUEST, REPS, totals) for _ in range(2000)]
    assert {p.branch for p in picks} == {"max_score_tie"}
    counts = Counter(p.index for p in picks)
    assert set(counts) == tied
    share = 2000 / len(tied)
    assert all(abs(c - share) < 0.15 * share for c in counts.values()), counts


def test_max_score_tie_epsilon_zero_is_exact() -> None:
    picker = PLUGINS["max_score"].build({"seed": 1, "tie_epsilon": 0})
    assert picker.pick(REQUEST, REPS, [0.1 + 0.2, 0.3, 0.0, 0.0]).index == 0
