from __future__ import annotations

from collections import Counter

import pytest

from routing import PLUGINS
from tests.routing.replicas import REQUEST, replica


def test_round_robin_is_even_over_three_replicas() -> None:
    reps = [replica(n) for n in "abc"]
    picker = PLUGINS["round_robin"].build({})
    picks = [picker.pick(REQUEST, reps, [0.0] * 3) for _ in range(300)]
    assert {p.branch for p in picks} == {"round_robin"}
    assert Counter(reps[p.index].name for p in picks) == {"a": 100, "b": 100, "c": 100}
    assert [p.index for p in picks[:6]] == [0, 1, 2, 0, 1, 2]


def test_round_robin_stays_fair_when_the_candidate_set_changes() -> None:
    full = [replica(n) for n in "abcd"]
    picker = PLUGINS["round_robin"].build({})
    counts: Counter[str] = Counter()
    fair: dict[str, float] = dict.fromkeys("abcd", 0.0)
    for step in range(1200):
        # Replica "d" drops out for one stretch, "a" for another.
        if 300 <= step < 600:
            cands = full[:3]
        elif 600 <= step < 900:
            cands = full[1:]
        else:
            cands = full
        pick = picker.pick(REQUEST, cands, [0.0] * len(cands))
        counts[cands[pick.index].name] += 1
        for r in cands:
            fair[r.name] += 1 / len(cands)
    # a and d are present for 900 steps (250 fair picks), b and c for all 1200 (350).
    assert fair == pytest.approx({"a": 250, "b": 350, "c": 350, "d": 250})
    assert all(abs(counts[n] - fair[n]) <= 2 for n in "abcd"), counts


def test_round_robin_ignores_scores() -> None:
    reps = [replica(n) for n in "ab"]
    picker = PLUGINS["round_robin"].build({})
    assert [picker.pick(REQUEST, reps, [0.0, 1.0]).index for _ in range(4)] == [0, 1, 0, 1]
