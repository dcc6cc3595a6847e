"""Outlier ejection and per-try timeouts over real sockets, in front of a simulated fleet."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import pytest

from gateway.config import HealthCheckConfig, RoutingConfig, UpstreamConfig
from gateway.replicas.outlier import OutlierConfig
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState
from simulator import SimFleet
from tests.gateway.conftest import STORY, eventually, gateway_config, idle, in_process, set_faults


class ProbeCount:
    """Passing probes of each replica, as the pool is told of them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.passed: dict[str, int] = {}
        original = ReplicaPool.probe_passed

        def counted(pool: ReplicaPool, replica: ReplicaState) -> None:
            self.passed[replica.name] = self.passed.get(replica.name, 0) + 1
            original(pool, replica)

        monkeypatch.setattr(ReplicaPool, "probe_passed", counted)


async def test_a_replica_failing_every_request_while_its_health_passes_stays_ejected(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    probes = ProbeCount(monkeypatch)
    cfg = gateway_config(
        fleet,
        # Every replica in turn, and probes far more often than the ejection lasts.
        routing=RoutingConfig(profile="round_robin"),
        health_check=HealthCheckConfig(interval_s=0.02, timeout_s=0.5),
    )
    async with in_process(cfg) as gw:
        pool = gw.runtime.pool
        sim0 = pool["sim-0"]
        await set_faults(fleet.replicas[0].url, error_rate=1.0, error_status=500)
        probed_while_ejected = None
        with caplog.at_level(logging.INFO, logger="llm_gateway"):
            for _ in range(200):
                r = await gw.client.post("/v1/chat/completions", json=STORY)
                assert r.status_code == 200
                if pool.outlier.ejected("sim-0"):
                    if probed_while_ejected is None:
                        probed_while_ejected = probes.passed.get("sim-0", 0)
                    # Held out, though its /health answers 200 all along.
                    assert not sim0.healthy
        assert probed_while_ejected is not None, "sim-0 was never ejected"
        assert probes.passed["sim-0"] - probed_while_ejected >= 5
        assert 3 <= sim0.errors_total <= 10
        assert pool["sim-1"].errors_total == 0 and idle(gw)
        messages = [rec.getMessage() for rec in caplog.records]
        assert messages.count("replica sim-0 ejected for 30 s: consecutive_failures (ejection 1)")
        assert not [m for m in messages if "sim-0 is up" in m or "sim-0 returns" in m]
        text = (await gw.client.get("/metrics")).text
        assert 'llm_gateway_replica_ejected{replica="sim-0"} 1.0' in text
        assert (
            'llm_gateway_outlier_ejections_total{reason="consecutive_failures",replica="sim-0"} 1.0'
            in text
        )


async def test_an_ejected_replica_returns_when_its_time_is_up_and_ramps(
    fleet: SimFleet, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        health_check=HealthCheckConfig(interval_s=0.02, timeout_s=0.5),
        # Back at 10% of the decisions for 3 s, then (x 20) all of them.
        outlier=OutlierConfig(
            base_ejection_s=0.5, ramp_start=0.1, ramp_factor=20.0, ramp_step_s=3.0
        ),
    )
    async with in_process(cfg) as gw:
        pool, sim0 = gw.runtime.pool, gw.runtime.pool["sim-0"]
        await set_faults(fleet.replicas[0].url, error_rate=1.0, error_status=500)
        with caplog.at_level(logging.INFO, logger="llm_gateway.outlier"):
            while not pool.outlier.ejected("sim-0"):
                assert (await gw.client.post("/v1/chat/completions", json=STORY)).status_code == 200
            ejected_at = time.monotonic()
            await set_faults(fleet.replicas[0].url, error_rate=0.0)
            # Its probes pass at once, yet it is out until its ejection is over.
            await eventually(lambda: sim0.healthy, timeout=3.0, what="sim-0 back")
            assert time.monotonic() - ejected_at >= 0.5
            assert pool.outlier.ramping == {"sim-0"}
            served = sim0.requests_total
            for _ in range(40):
                assert (await gw.client.post("/v1/chat/completions", json=STORY)).status_code == 200
            # One decision in 10, where round-robin alone would send it 20 of the 40.
            assert 3 <= sim0.requests_total - served <= 5
            await eventually(lambda: not pool.outlier.ramping, timeout=6.0, what="ramp done")
            served = sim0.requests_total
            for _ in range(20):
                assert (await gw.client.post("/v1/chat/completions", json=STORY)).status_code == 200
            assert sim0.requests_total - served == 10
        messages = [rec.getMessage() for rec in caplog.records]
        assert "replica sim-0 returns after its ejection: ramping up from 10% of its share" in (
            messages
        )
        assert "replica sim-0 ramp-up done: back to its full share" in messages
        assert sim0.errors_total == 3


async def test_a_replica_that_accepts_and_never_answers_is_retried_within_the_head_timeout(
    fleet: SimFleet,
) -> None:
    cfg = gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        health_check=HealthCheckConfig(interval_s=30.0),
        upstream=replace(
            UpstreamConfig(connect_timeout_s=1.0),
            response_head_timeout_s=0.3,
            first_byte_timeout_s=30.0,
        ),
    )
    async with in_process(cfg) as gw:
        # Silent before its status line for 3 s (the simulator's stall before the first byte):
        # without a head deadline the request would wait it out, then be served by it.
        await set_faults(fleet.replicas[0].url, stall_seconds=3.0)
        for _ in range(2):  # round-robin: at least one of them goes to sim-0 first
            started = time.monotonic()
            r = await gw.client.post("/v1/chat/completions", json={**STORY, "stream": True})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
            assert time.monotonic() - started < 2.0
        retried = gw.runtime.metrics.registry.get_sample_value(
            "llm_gateway_upstream_retries_total", {"replica": "sim-0", "reason": "head_timeout"}
        )
        assert retried is not None and retried >= 1.0
        await eventually(lambda: idle(gw), what="in-flight back to 0")
