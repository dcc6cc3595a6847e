"""The overhead benchmark: its client against the static upstream, its maths, a tiny run."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from benchmarks import overhead
from benchmarks.loadgen_http import RoundResult, chat_request, run_round
from benchmarks.overhead_report import DIRECT, GATEWAY, Measured, build_rows, evaluate_targets
from benchmarks.static_upstream import MODEL, start

ROW_FIELDS = {
    "target",
    "concurrency",
    "stream",
    "rps",
    "p50_ms",
    "p99_ms",
    "added_p50_ms",
    "added_p99_ms",
    "rps_ratio_vs_direct",
    "cpu_us_per_request",
    "gateway_cpu_util",
    "chunks_per_s",
    "ttfc_p50_ms",
    "requests",
    "errors",
}


def _cpu() -> dict[str, float]:
    return {"gateway": 0.0, "upstream": 0.0, "loadgen": time.process_time()}


@pytest.mark.parametrize("stream", [False, True])
async def test_loadgen_completes_every_request_against_static_upstream(stream: bool) -> None:
    server = await start("127.0.0.1", 0, chunks=7)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_round(
            "127.0.0.1",
            port,
            chat_request("127.0.0.1", port, MODEL, stream),
            concurrency=3,
            duration_s=0.2,
            stream=stream,
            expect_events=8,
            cpu_snapshot=_cpu,
        )
    finally:
        server.close()
    assert result.errors == 0, result.error_kinds
    assert result.requests > 0
    assert len(result.latencies_s) == result.requests
    if stream:
        # 7 deltas + [DONE] per answer, counted only inside the window.
        assert result.events >= 8 * result.requests
        assert len(result.ttfc_s) == result.requests
    else:
        assert result.events == 0


async def test_loadgen_flags_a_stream_with_the_wrong_event_count() -> None:
    server = await start("127.0.0.1", 0, chunks=5)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_round(
            "127.0.0.1",
            port,
            chat_request("127.0.0.1", port, MODEL, True),
            concurrency=2,
            duration_s=0.1,
            stream=True,
            expect_events=9,
            cpu_snapshot=_cpu,
        )
    finally:
        server.close()
    assert result.requests == 0
    assert result.error_kinds == {"bad_stream": 2}


def _round(target: str, index: int, requests: int, latency_ms: float) -> Measured:
    result = RoundResult(
        duration_s=1.0,
        requests=requests,
        errors=0,
        latencies_s=[latency_ms / 1e3] * requests,
        ttfc_s=[],
        events=0,
        http_chunks=0,
        cpu_s={"gateway": 0.5 if target == GATEWAY else 0.0, "upstream": 0.1, "loadgen": 0.2},
    )
    return Measured(target, 1, False, index, result)


def test_rows_pair_each_gateway_round_with_its_direct_round() -> None:
    measured = [
        _round(DIRECT, 0, 10_000, 0.1),
        _round(GATEWAY, 0, 2_000, 0.5),
        _round(DIRECT, 1, 8_000, 0.2),
        _round(GATEWAY, 1, 2_000, 0.4),
    ]
    rows = build_rows(measured)
    direct, gw = rows
    assert direct["target"] == DIRECT and direct["added_p50_ms"] == 0.0
    assert direct["rps_ratio_vs_direct"] == 1.0
    assert gw["rps"] == 2000.0
    assert gw["added_p50_ms"] == pytest.approx(0.3)  # median of 0.4 and 0.2
    assert gw["rps_ratio_vs_direct"] == pytest.approx(0.225)  # median of 0.2 and 0.25
    assert gw["cpu_us_per_request"] == 250.0
    assert gw["chunks_per_s"] is None
    targets = {t["field"]: t for t in evaluate_targets(rows)}
    assert targets["added_p50_ms"]["passed"] is True
    assert targets["rps"]["value"] is None and targets["rps"]["passed"] is None


def test_tiny_run_writes_results_and_report(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    out = tmp_path / "overhead"
    args = parser.parse_args(
        [
            "--quick",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--concurrency",
            "1,4",
            "--stream-chunks",
            "8",
            "--out",
            str(out),
        ]
    )
    assert overhead.run(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    cells = {(r["target"], r["concurrency"], r["stream"]) for r in rows}
    assert cells == {(t, c, s) for t in (DIRECT, GATEWAY) for c in (1, 4) for s in (False, True)}
    for row in rows:
        assert row.keys() >= ROW_FIELDS
        assert row["errors"] == 0, row["error_kinds"]
        assert row["requests"] > 0
        assert (row["chunks_per_s"] is not None) == row["stream"]
        assert (row["ttfc_p50_ms"] is not None) == row["stream"]
    assert results["parameters"]["concurrency"] == [1, 4]
    assert results["machine"]["cpus_usable"] >= 1
    assert [t["passed"] is None for t in results["targets"]] == [False, True, False]
    assert len(results["rounds"]) == len(rows)
    report = (out / "report.md").read_text()
    assert "| target | c | stream |" in report
    assert "## Targets" in report
    assert "rps_ratio_vs_direct" in report
