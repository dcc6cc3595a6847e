"""The routing-cost micro-benchmark runs end to end and writes its documented schema."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli import main

FIELDS = {
    "mode", "prompt_tokens", "replicas", "tokenize_us", "hash_us", "decision_us", "route_us",
    "matched_blocks", "prompt_blocks", "index_blocks", "bytes_per_block",
}  # fmt: skip


def test_routing_cost_quick(tmp_path: Path) -> None:
    assert main(["bench", "routing-cost", "--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["rows"]
    assert sorted((r["mode"], r["prompt_tokens"] > 4000, r["replicas"]) for r in rows) == [
        (m, long, n)
        for m in ("approximate", "precise")
        for long in (False, True)
        for n in (4, 8, 16)
    ]
    # The bound is judged on the 16-replica rows (the worst of them).
    worst = max(r["decision_us"] for r in rows if r["replicas"] == 16)
    assert results["target"] == {
        "replicas": 16, "decision_us": 150.0, "worst_decision_us": worst, "pass": worst <= 150.0
    }  # fmt: skip
    for r in rows:
        assert set(r) == FIELDS
        # The request is one replica's cached prompt plus a new question: every block but the
        # one the question reaches into is a hit.
        assert r["prompt_blocks"] - 1 <= r["matched_blocks"] <= r["prompt_blocks"]
        assert r["matched_blocks"] > 0
        assert r["index_blocks"] > 0 and r["bytes_per_block"] > 0
        assert (r["tokenize_us"] > 0) == (r["mode"] == "precise")
    assert "| precise |" in (tmp_path / "report.md").read_text()
