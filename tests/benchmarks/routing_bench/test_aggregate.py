from __future__ import annotations

from typing import Any

import pytest

from benchmarks.routing_bench.aggregate import fold_seeds


def _row(seed: int, **kw: Any) -> dict[str, Any]:
    base = {
        "contender": "gateway:default",
        "workload": "shared_prefix",
        "offered_qps": 40.0,
        "fleet": "sim",
        "status": "ok",
        "seed": seed,
        "ttft_p90_s": 1.0,
        "output_tok_s": 100.0,
        "success_rate": 1.0,
        "hit_rate": 0.8,
        "cpu_cores": {"fleet": 0.1},
        "cpu_saturated": [],
        "contended": False,
        "errors": {},
    }
    return {**base, **kw}


def test_seeds_fold_to_the_median_and_success_to_the_mean() -> None:
    rows = [
        _row(0, ttft_p90_s=1.0, output_tok_s=90.0, success_rate=1.0),
        _row(1, ttft_p90_s=9.0, output_tok_s=100.0, success_rate=0.97),
        _row(2, ttft_p90_s=2.0, output_tok_s=120.0, success_rate=1.0),
    ]
    (row,) = fold_seeds(rows)
    assert row["ttft_p90_s"] == 2.0  # one unlucky seed does not move the median
    assert row["output_tok_s"] == 100.0
    assert row["success_rate"] == pytest.approx(0.99)
    assert row["seeds"] == [0, 1, 2]
    assert row["by_seed"]["ttft_p90_s"] == [1.0, 9.0, 2.0]
    assert "seed" not in row
    assert (row["contender"], row["workload"], row["offered_qps"]) == (
        "gateway:default",
        "shared_prefix",
        40.0,
    )


def test_the_worst_seed_flags_cpu_and_errors_are_summed() -> None:
    rows = [
        _row(0, cpu_cores={"fleet": 0.2, "loadgen": 0.1}, errors={"HTTP 0": 2}),
        _row(1, cpu_cores={"fleet": 0.95}, cpu_saturated=["fleet"], contended=True,
             errors={"HTTP 0": 1, "HTTP 503": 1}),
    ]  # fmt: skip
    (row,) = fold_seeds(rows)
    assert row["cpu_cores"] == {"fleet": 0.95, "loadgen": 0.1}
    assert row["cpu_saturated"] == ["fleet"]
    assert row["contended"] is True
    assert row["errors"] == {"HTTP 0": 3, "HTTP 503": 1}


def test_rows_are_grouped_by_contender_workload_and_load() -> None:
    rows = [
        _row(0),
        _row(1),
        _row(0, offered_qps=30.0),
        _row(0, contender="sglang:cache_aware"),
    ]
    folded = fold_seeds(rows)
    assert sorted((r["contender"], r["offered_qps"], len(r["seeds"])) for r in folded) == [
        ("gateway:default", 30.0, 1),
        ("gateway:default", 40.0, 2),
        ("sglang:cache_aware", 40.0, 1),
    ]


def test_a_contender_that_did_not_run_is_listed_once() -> None:
    down = {"contender": "litellm", "workload": "shared_prefix", "offered_qps": None,
            "status": "unavailable", "reason": "not installed"}  # fmt: skip
    folded = fold_seeds([{**down, "seed": 0}, {**down, "seed": 1}, _row(0)])
    assert [r["status"] for r in folded].count("unavailable") == 1
