"""One tiny run of the whole benchmark: a 2-replica fleet, 2 gateway profiles, 1 workload."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.routing_bench.fleet import SimParams
from benchmarks.routing_bench.suite import SuiteConfig, _contenders, _seeds, run_suite


def _tiny(out: Path, **kw: Any) -> SuiteConfig:
    """A 2-replica fleet, round-robin and the default, one load of shared prefixes."""
    return SuiteConfig(
        out=out,
        sim=SimParams(replicas=2, num_gpu_blocks=256, time_scale=4.0, stream_interval=8),
        workloads={"shared_prefix": (6.0,)},
        warmup_rate=20.0,
        warmup_timeout_s=15.0,
        drain_s=10.0,
        gateway_labels=("round_robin", "default"),
        with_peers=False,
        **kw,
    )


@pytest.mark.timeout(90)
async def test_tiny_run_writes_report_results_and_plots(tmp_path: Path) -> None:
    cfg = _tiny(tmp_path, step_s=2.0)
    rows = await run_suite(cfg)
    assert [r["contender"] for r in rows] == ["gateway:round_robin", "gateway:default"]
    for r in rows:
        assert r["status"] == "ok" and r["workload"] == "shared_prefix"
        assert r["offered_qps"] == 6.0 and r["fleet"] == "sim"
        assert r["requests"] > 0 and r["success_rate"] == 1.0
        assert r["ttft_p50_s"] > 0 and r["output_tok_s"] > 0
        assert 0.0 <= r["hit_rate"] <= 1.0
        assert set(r["cpu_cores"]) >= {"fleet", "contender", "loadgen"}
        assert r["send_lag_p99_ms"] is not None
    # The cache-aware default reuses the groups' prompts far more than round-robin.
    assert rows[1]["hit_rate"] > rows[0]["hit_rate"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["rows"]) == 2
    assert (tmp_path / "shared_prefix_ttft_p90.png").exists()
    assert "simulated" in (tmp_path / "report.md").read_text()
    raw = (tmp_path / "raw" / "gateway_default-shared_prefix.jsonl").read_text().splitlines()
    rec = json.loads(raw[-1])
    assert {"sent", "sched", "ttft", "gaps", "e2e", "tokens", "cached_tokens", "status"} <= set(rec)
    assert rec["replica"] in (0, 1)
    # Warm-up answers are cut to warmup_max_tokens; the measured ones keep the workload's.
    recs = [json.loads(x) for x in raw]
    warm = [r for r in recs if r["phase"] == "warmup"]
    assert warm and all(r["max_tokens"] == r["tokens"] == 16 for r in warm)
    assert all(r["max_tokens"] == 128 for r in recs if r["phase"] == "step")
    assert data["meta"]["plan"]["warmup_max_tokens"] == 16


@pytest.mark.timeout(120)
async def test_interleave_runs_seed_by_seed_each_seed_starting_with_the_next(
    tmp_path: Path,
) -> None:
    cfg = _tiny(tmp_path, step_s=1.0, seeds=(0, 1), interleave=True)
    rows = await run_suite(cfg)
    assert all(r["status"] == "ok" and r["success_rate"] == 1.0 for r in rows)
    seed_rows = json.loads((tmp_path / "results.json").read_text())["seed_rows"]
    order = [(r["seed"], r["contender"]) for r in seed_rows]
    assert order == [
        (0, "gateway:round_robin"),
        (0, "gateway:default"),
        (1, "gateway:default"),
        (1, "gateway:round_robin"),
    ]
    raw = sorted(p.name for p in (tmp_path / "raw").glob("*.jsonl"))
    assert raw == [
        f"gateway_{c}-shared_prefix-s{s}.jsonl" for c in ("default", "round_robin") for s in (0, 1)
    ]


def test_missing_peers_module_is_reported_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "benchmarks.routing_bench.peers", None)
    cfg = SuiteConfig(out=Path("unused"), gateway_labels=("default",))
    contenders, missing = _contenders(cfg)
    assert [c.name for c in contenders] == ["gateway:default"]
    assert missing[0]["contender"] == "peers"
    assert "peers module missing" in missing[0]["reason"]


def test_seeds_option_runs_every_workload_once_per_seed() -> None:
    import argparse

    from benchmarks.routing_bench.cli import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--seeds", "0,1,2", "--workloads", "low_sharing"]))
    assert cfg.seeds == (0, 1, 2)
    assert "--seeds 0,1,2" in cfg.command
    assert config_from_args(parser.parse_args(["--seed", "7"])).seeds == (7,)
    assert not cfg.interleave
    mixed = config_from_args(parser.parse_args(["--seeds", "0,1", "--interleave"]))
    assert mixed.interleave and "--interleave" in mixed.command
    some = parser.parse_args(["--seeds", "3,4", "--seeds-for", "shared_prefix"])
    cfg = config_from_args(some)
    assert (_seeds(cfg, "shared_prefix"), _seeds(cfg, "bimodal")) == ((3, 4), (3,))
    with pytest.raises(ValueError, match="unknown workloads: nope"):
        config_from_args(parser.parse_args(["--seeds-for", "nope"]))
