"""`bench tenants`: its maths, and a small run showing the mechanisms (not timing on a shared box).

Ratios carry generous margins: a quota that did nothing would still show as B never refused,
and a FIFO queue would hold each P0 probe behind the whole P2 backlog (about `flood_queue`
dispatch slots, not one or two).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import tenants
from benchmarks.tenants import Params, gateway_toml, measure, pct
from benchmarks.tenants_report import markdown
from gateway.config import parse_config


def test_pct_interpolates_between_order_statistics() -> None:
    assert pct([], 0.9) is None
    assert pct([5.0], 0.9) == 5.0
    assert pct([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert pct([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)


@pytest.mark.parametrize("part", ["isolation", "priority"])
def test_the_generated_configurations_load(part: str) -> None:
    import tomllib

    p = Params(out=Path("unused"))
    cfg = parse_config(tomllib.loads(gateway_toml(p, 8000, ["http://127.0.0.1:9000"], part)))
    names = set(cfg.tenancy.tenants)
    if part == "isolation":
        assert names == {"A", "B"}
        assert cfg.tenancy.tenants["B"].requests_per_minute == p.b_rpm
    else:
        assert names == {"app"} and cfg.routing.profile == "slots"
        assert cfg.tenancy.tenants["app"].max_priority == 0


async def test_a_small_run_shows_quota_isolation_and_p0_first(tmp_path: Path) -> None:
    p = Params(
        out=tmp_path,
        replicas=2,
        phase_s=3.0,
        a_rate=5.0,
        flood_queue=16,
        flood_s=6.0,
        probe_gap_s=0.5,
        baseline_probes=4,
    )
    r = await measure(p)
    iso, prio = r["isolation"], r["priority"]
    assert all(ph["a"]["errors"] == 0 for ph in iso["phases"]), iso["phases"]
    b = [ph["b"] for ph in iso["phases"] if "b" in ph]
    # B sent 10x its per-minute quota and was refused, by its limits and nothing else.
    assert all(x["refused_by_limit"] and x["other"] == 0 for x in b), b
    assert sum(iso["b_quota_refusals"].values()) == sum(
        sum(x["refused_by_limit"].values()) for x in b
    )
    assert iso["p90_ratio"] is not None and iso["p90_ratio"] < 2.0
    assert prio["probes"] and all(pr["status"] == 200 for pr in prio["probes"])
    # Behind the backlog (FIFO) a probe would wait ~16 slots, with ~16 P2 ahead of it.
    assert prio["median_wait_slots"] is not None and prio["median_wait_slots"] <= 3.0, prio
    assert prio["max_p2_ahead"] is not None and prio["max_p2_ahead"] <= 2, prio
    meta = {"date": "d", "command": "c", "machine": {"cpus_usable": 2, "loadavg_at_start": [0.0]}}
    text = markdown({"meta": meta, **r})
    assert "## P0 under a P2 flood" in text and "A's TTFT p90" in text


def test_the_command_registers_its_options() -> None:
    parser = argparse.ArgumentParser()
    tenants.add_arguments(parser)
    args = parser.parse_args(["--phase", "2", "--a-rate", "3"])
    assert (args.phase, args.a_rate, args.flood) == (2.0, 3.0, 20.0)
