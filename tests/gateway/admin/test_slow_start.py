"""Slow start: a replica added at runtime takes a growing share of decisions, as measured."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from gateway.admin.fleet import parse_replica
from gateway.replicas.outlier import OutlierConfig
from simulator import SimFleet
from tests.gateway.admin.conftest import fleet_config, started
from tests.gateway.conftest import SIM, STORY, in_process

# 5% of its share, x3 every 1.5 s: 5%, 15%, 45%, then all of it after 4.5 s.
RAMP = OutlierConfig(ramp_start=0.05, ramp_factor=3.0, ramp_step_s=1.5)


@pytest.mark.parametrize("slow_start", [True, False])
async def test_an_added_replica_ramps_up(slow_start: bool) -> None:
    async with SimFleet(SIM, replicas=3, host="127.0.0.1", base_port=0) as fleet:
        cfg = fleet_config(fleet, outlier=RAMP)
        cfg = replace(cfg, discovery=replace(cfg.discovery, slow_start=slow_start))
        async with in_process(cfg) as gw:
            pool, c = gw.runtime.pool, gw.client
            new = parse_replica({"name": "sim-2", "url": fleet.replicas[2].url})
            sim2 = await gw.runtime.fleet.add(new, "admin")
            assert sim2.healthy
            # Decisions by the admit fraction in force when each was made.
            sent: dict[float, int] = defaultdict(int)
            hits: dict[float, int] = defaultdict(int)
            while pool.outlier.ramping:
                fraction = pool.outlier.fraction("sim-2", pool.clock())
                before = started(sim2)
                r = await c.post("/v1/chat/completions", json=STORY)
                assert r.status_code == 200
                sent[fraction] += 1
                hits[fraction] += started(sim2) - before
            after = started(sim2)
            for _ in range(30):
                assert (await c.post("/v1/chat/completions", json=STORY)).status_code == 200
            full = started(sim2) - after
        if not slow_start:
            assert not sent  # never ramped: a full share from its first decision
            assert full == 10  # round-robin over three
            return
        # (A decision at the ramp's very end sees a fraction of 1: not a ramp step.)
        levels = sorted(f for f in sent if f < 1.0)
        assert levels == pytest.approx([0.05, 0.15, 0.45])
        share = [hits[f] / sent[f] for f in levels]
        assert all(sent[f] >= 20 for f in levels), sent
        # Each step a larger share, never more than its fraction (plus one decision held).
        assert share[0] < share[1] < share[2], share
        for f, s in zip(levels, share, strict=True):
            assert s <= f + 1.0 / sent[f] + 0.02, (f, s)
        assert share[2] >= 0.15, share
        assert 9 <= full <= 11
