import math

import pytest

from benchmarks.routing_bench.stats import (
    Snapshot,
    cpu_use,
    error_kinds,
    hit_rate,
    imbalance,
    percentile,
    step_row,
    token_itls,
    tokens_in_window,
)


def test_percentile_interpolates_between_ranks() -> None:
    vals = [4.0, 1.0, 3.0, 2.0]
    assert percentile(vals, 0) == 1.0
    assert percentile(vals, 100) == 4.0
    assert percentile(vals, 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 90) == pytest.approx(90.0)
    assert percentile(list(range(11)), 99) == pytest.approx(9.9)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_imbalance_is_mean_std_over_mean() -> None:
    assert imbalance([[2, 2, 2, 2]]) == 0.0
    # std/mean of [0, 4] = 2/2 = 1; of [1, 3] = 1/2; idle samples are skipped.
    assert imbalance([[0, 4], [1, 3], [0, 0]]) == pytest.approx(0.75)
    assert imbalance([[0, 0, 0]]) is None
    assert imbalance([]) is None


def _rec(**kw: object) -> dict:
    base = {"status": 200, "error": None, "sent": 100.0, "sched": 99.99, "ttft": 0.5,
            "gaps": [0.08, 0.08, 0.16], "tokens": 25, "e2e": 0.82, "prompt_tokens": 100,
            "cached_tokens": 50}  # fmt: skip
    base.update(kw)
    return base


def test_token_itls_spread_chunk_gaps_over_their_tokens() -> None:
    # 25 tokens: 1 in the first chunk, 24 over 3 gaps = 8 per chunk.
    assert token_itls(_rec()) == pytest.approx([0.01, 0.01, 0.02])
    assert token_itls(_rec(gaps=[], tokens=1)) == []


def test_tokens_in_window_counts_delivery_times() -> None:
    r = _rec()  # chunks at 100.5 (1 token), 100.58, 100.66, 100.82 (8 each)
    assert tokens_in_window(r, 100.0, 101.0) == 25
    assert tokens_in_window(r, 100.0, 100.6) == 9
    assert tokens_in_window(r, 100.6, 101.0) == 16
    assert tokens_in_window(_rec(ttft=None), 0, 1e9) == 0


def test_hit_rate_and_cpu_from_snapshots() -> None:
    a = Snapshot(10.0, 100.0, 1000.0, {"fleet": 5.0, "loadgen": 1.0})
    b = Snapshot(12.0, 400.0, 2000.0, {"fleet": 6.0, "loadgen": 1.5, "new": 3.0})
    assert hit_rate(a, b) == pytest.approx(0.3)
    assert hit_rate(a, a) is None
    assert cpu_use(a, b) == {"fleet": 0.5, "loadgen": 0.25}


def test_step_row_on_small_inputs() -> None:
    good = [_rec(ttft=t, sched=100.0 - 0.001) for t in (0.1, 0.2, 0.3, 0.4)]
    bad = _rec(status=503, error="busy", ttft=None, gaps=[], tokens=0)
    a = Snapshot(100.0, 0.0, 0.0, {"fleet": 0.0, "contender": 0.0, "loadgen": 0.0,
                                   "machine": 0.0})  # fmt: skip
    b = Snapshot(102.0, 50.0, 100.0, {"fleet": 1.9, "contender": 0.2, "loadgen": 0.1,
                                      "machine": 3.4}, preemptions=3.0)  # fmt: skip
    row = step_row([*good, bad], a, b, [[1, 3], [2, 2]], [*good, bad])
    assert row["requests"] == 5
    assert row["success_rate"] == 0.8
    assert row["ttft_p50_s"] == pytest.approx(0.25)
    assert row["ttft_p90_s"] == pytest.approx(0.37)
    assert row["hit_rate"] == 0.5
    assert row["cached_token_rate"] == 0.5
    assert row["imbalance"] == pytest.approx(0.25)
    assert row["preemptions"] == 3
    assert row["errors"] == {"HTTP 503": 1}
    assert row["cpu_saturated"] == ["fleet"]  # 0.95 of a core
    assert row["cpu_cores"]["others"] == pytest.approx(0.6)
    assert row["contended"] is True
    assert row["send_lag_p50_ms"] == pytest.approx(1.0, abs=0.01)
    assert row["output_tok_s"] == pytest.approx(4 * 25 / 2.0)
    assert math.isclose(row["itl_p50_s"], 0.01)


def test_error_kinds_name_the_status_else_the_error() -> None:
    records = [
        {"status": 503, "error": "overloaded", "ttft": None},
        {"status": 0, "error": "cancelled at the drain deadline", "ttft": None},
        {"status": 200, "error": "stream cut", "ttft": 0.1},
        {"status": 200, "error": None, "ttft": 0.1},
    ]
    assert error_kinds(records) == {
        "HTTP 503": 1,
        "cancelled at the drain deadline": 1,
        "stream cut": 1,
    }
