"""A real replica SIGKILLed under load: nothing lost, ejected, routed to again after its restart.

The kill uses the package's fleet (replica 1) and restarts it on its own ports before the test
ends, so later modules see the same two replicas (a fresh engine: empty prefix cache, counters
from 0). The analysis functions of the real-vLLM fault run are checked here on hand-made
samples, the kill test then runs them on real ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from benchmarks.faults.accounting import summarize
from benchmarks.faults.clients import LoadSettings, run_load
from benchmarks.faults.vllm_observe import (
    LogEvent,
    Observer,
    Sample,
    acquired_between,
    budget_view,
    ejection_after,
    routed_while_out,
    share_windows,
)
from benchmarks.vllm_cpu import VllmFleet
from gateway.config import HealthCheckConfig
from gateway.process import running_gateway
from gateway.replicas.outlier import OutlierConfig
from gateway.replicas.pool import ReplicaPool
from tests.vllm.conftest import TIMEOUT_S, gateway_config, wait_until


def _s(t: float, routable: bool, acquired: int, retrying: int = 0, flight: int = 4) -> Sample:
    """Two replicas: r0 always routable with `flight` in flight; r1 as given."""
    return Sample(t, (True, routable), (False, not routable), (10 * int(t), acquired),
                  (flight, 0), (1.0, 1.0), retrying, 0)  # fmt: skip


def test_an_attempt_to_an_unroutable_replica_is_counted() -> None:
    clean = [_s(0, True, 5), _s(1, False, 6), _s(2, False, 6), _s(3, True, 6), _s(4, True, 9)]
    assert routed_while_out(clean, 1, 0, 4) == 0
    leaked = [_s(0, True, 5), _s(1, False, 6), _s(2, False, 7), _s(3, True, 7)]
    assert routed_while_out(leaked, 1, 0, 3) == 1
    assert acquired_between(clean, 1, 0, 1) == 1 and acquired_between(clean, 1, 3, 4) == 3


def test_share_windows_and_the_budget_view() -> None:
    samples = [_s(t, True, a, retrying=r) for t, a, r in ((0, 0, 0), (10, 1, 3), (20, 6, 5))]
    rows = share_windows(samples, 1, 0.0, 10.0)
    assert [(w["attempts"], w["to_replica"]) for w in rows] == [(101, 1), (105, 5)]
    view = budget_view(samples, ratio=0.2, floor=3)
    # 4 in flight: the bound is max(3, 0.8) = 3, and 5 retries in flight is over it.
    assert view["peak_retries_in_flight"] == 5 and view["samples_over_bound"] == 1


def test_the_ejection_and_its_rule_are_read_from_the_log_line() -> None:
    events = [
        LogEvent(1.0, "llm_gateway.outlier", "replica vllm-0 ejected for 30 s: x (ejection 1)"),
        LogEvent(5.0, "llm_gateway.health", "replica vllm-1 is down: refused"),
        LogEvent(6.0, "llm_gateway.outlier",
                 "replica vllm-1 ejected for 30 s: consecutive_failures (ejection 1)"),
    ]  # fmt: skip
    assert ejection_after(events, "vllm-1", 2.0) == (6.0, "consecutive_failures")
    assert ejection_after(events, "vllm-0", 2.0) is None


@pytest.mark.asyncio(loop_scope="package")
@pytest.mark.timeout(TIMEOUT_S)
async def test_a_killed_replica_loses_nothing_is_ejected_and_returns(fleet: VllmFleet) -> None:
    victim = 1
    name, other = fleet.replicas[victim].name, fleet.replicas[0].name
    # Health checks every 5 s: the passive detectors, not the probes, must take it out. A
    # short ramp (50%, then full after 2 s) so that its return shows within seconds.
    cfg = replace(
        gateway_config(fleet, kv_events=False),
        health_check=HealthCheckConfig(interval_s=5.0, timeout_s=2.0),
        outlier=OutlierConfig(ramp_start=0.5, ramp_factor=2.0, ramp_step_s=2.0),
    )
    load = LoadSettings(concurrency=4, duration_s=300.0, deadline_s=60.0, min_tokens=8,
                        max_tokens=32, unary_share=0.25, cancel_share=0.0, prompts=512)  # fmt: skip
    stop = [False, False]
    try:
        async with running_gateway(cfg) as gw:
            pool = gw.runtime.pool
            await _until(lambda: _all_up(pool), "both replicas up", within=30)
            obs = Observer(gw.runtime, (other, name), time.monotonic())
            done = asyncio.Event()
            with obs.capturing():
                sampler = asyncio.create_task(obs.run(done))
                clients = asyncio.create_task(run_load(load, gw.url, fleet.model, lambda: stop[0]))
                await _until(lambda: pool[name].in_flight > 0, f"a request on {name}", within=30)
                kill = obs.sample().t
                await fleet.kill(victim)
                await _until(lambda: not pool[name].healthy, f"{name} out", within=10)
                # Load goes on without it for a while: nothing more may be routed there.
                base = obs.sample().acquired[0]
                await _until(lambda: obs.sample().acquired[0] > base + 20, f"{other} serving")
                stop[0] = True
                first = await clients
                # The restart runs on an idle fleet: under load it takes minutes on 2 cores.
                await fleet.restart(victim)
                restarted = obs.sample().t
                await _until(lambda: pool[name].healthy, f"{name} routable", within=30)
                back, before = obs.sample().t, obs.sample().acquired[1]
                again = replace(load, concurrency=2, seed=1, duration_s=30.0)
                second = await run_load(
                    again, gw.url, fleet.model, lambda: obs.sample().acquired[1] > before + 2
                )
                await _until(lambda: sum(r.in_flight for r in pool) == 0, "in flight 0")
                done.set()
                await sampler
    finally:
        if not fleet.alive(victim):  # whatever failed, later modules get their two replicas
            await fleet.restart(victim)
    for run in (first, second):
        s = summarize(run.records, run.sent)
        # Every request ended complete or with a clear error (the streams the kill cut: an
        # SSE error event; a retry the budget refused: 502 in vLLM's shape); none hung.
        assert s.lost == 0 and s.counts_match, (s.lost_by_kind, s.errors_by_kind)
        assert s.completed > 0 and set(s.errors_by_kind) <= {"sse_502", "http_502"}
    assert summarize(second.records, second.sent).errors == 0
    ejected = ejection_after(obs.events, name, kill)
    assert ejected is not None, [e.message for e in obs.events]
    assert ejected[0] - kill < 10.0 and ejected[1] in ("consecutive_failures", "failure_rate")
    assert routed_while_out(obs.samples, 1, kill, restarted) == 0
    assert acquired_between(obs.samples, 1, back, obs.samples[-1].t) > 2


async def _until(pred: Callable[[], bool], what: str, within: float = 15.0) -> None:
    async def probe() -> bool:
        return pred()

    await wait_until(probe, what, within=within)


def _all_up(pool: ReplicaPool) -> bool:
    return all(r.healthy and r.models for r in pool)
