"""The pool applying the outlier policy: leases, probes, the ramp the router honours, metrics."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from gateway.config import ReplicaConfig
from gateway.replicas.outlier import OutlierConfig
from gateway.replicas.pool import ReplicaPool
from routing.profile import BUILTIN_PROFILES
from routing.router import Router
from routing.types import RequestFeatures
from telemetry.metrics import GatewayMetrics

MODEL = "m"


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(n: int = 2, models: tuple[tuple[str, ...], ...] = (), **cfg: object) -> ReplicaPool:
    configs = tuple(
        ReplicaConfig(
            url=f"http://r{i}:8000", name=f"r{i}", models=models[i] if models else (MODEL,)
        )
        for i in range(n)
    )
    p = ReplicaPool.from_configs(configs)
    p.clock = Clock()
    p.configure_outlier(OutlierConfig(**cfg))  # type: ignore[arg-type]
    for replica in p:
        p.probe_passed(replica)  # up for the first time: no ramp
    return p


def clock(p: ReplicaPool) -> Clock:
    assert isinstance(p.clock, Clock)
    return p.clock


def fail(p: ReplicaPool, name: str, times: int = 1, detail: str = "") -> None:
    for _ in range(times):
        p.acquire(name).release(False, detail)


def snapshot(p: ReplicaPool, name: str) -> tuple[bool, bool]:
    """(healthy, admitted) of `name` in a fresh set of snapshots."""
    snap = next(s for s in p.snapshots() if s.name == name)
    return snap.healthy, snap.admitted


def test_a_passing_probe_does_not_end_a_passive_ejection(caplog: pytest.LogCaptureFixture) -> None:
    p = pool()
    r0 = p["r0"]
    with caplog.at_level(logging.INFO):
        fail(p, "r0", times=3)
        assert not r0.healthy and snapshot(p, "r0") == (False, True)
        for _ in range(10):
            clock(p).now += 2.9
            p.probe_passed(r0)
        assert not r0.healthy and p.outlier.ejected("r0")
        clock(p).now += 1.0  # 30 s after the ejection
        assert snapshot(p, "r0") == (True, False)  # back, and sitting out: its ramp began
    ejected = [r for r in caplog.records if "ejected" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in ejected] == [
        (logging.WARNING, "replica r0 ejected for 30 s: consecutive_failures (ejection 1)")
    ]
    back = [r for r in caplog.records if "returns" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in back] == [
        (logging.INFO, "replica r0 returns after its ejection: ramping up from 1% of its share")
    ]


def test_a_replica_failing_probes_when_its_ejection_ends_stays_down_then_ramps() -> None:
    p = pool()
    r0 = p["r0"]
    fail(p, "r0", times=3)
    p.probe_failed(r0, "health status 503")
    clock(p).now += 31.0
    assert snapshot(p, "r0") == (False, True) and not p.outlier.ejected("r0")
    p.probe_passed(r0)
    # The same ramp as an ejection's end: one mechanism for every return.
    assert r0.healthy and p.outlier.ramping == {"r0"}
    assert p.outlier.fraction("r0", clock(p).now) == 0.01


def test_a_replica_back_up_after_failed_probes_ramps(caplog: pytest.LogCaptureFixture) -> None:
    p = pool()
    r1 = p["r1"]
    with caplog.at_level(logging.INFO, logger="llm_gateway.health"):
        p.probe_failed(r1, "TimeoutError")
        assert snapshot(p, "r1") == (False, True)
        p.probe_passed(r1)
    assert snapshot(p, "r1") == (True, False)
    assert [r.getMessage() for r in caplog.records] == [
        "replica r1 is down: TimeoutError",
        "replica r1 is up: ramping up from 1% of its share",
    ]


def route(p: ReplicaPool, router: Router, n: int) -> Counter[str]:
    """`n` requests, each routed, leased and served at once; where they went."""
    features = RequestFeatures(model=MODEL, prompt_hash=42)  # the very same request each time
    went: Counter[str] = Counter()
    for _ in range(n):
        decision = router.route(features, p.snapshots())
        p.acquire(decision.replica.name).release(True)
        went[decision.replica.name] += 1
    return went


def test_the_router_gives_a_returning_replica_its_ramps_share() -> None:
    p = pool()
    router = Router(BUILTIN_PROFILES["round_robin"])
    p.probe_failed(p["r1"], "down")
    p.probe_passed(p["r1"])
    # 1% of the decisions at first: 1 in 100 (the first after 100, its credit starting at 0).
    assert route(p, router, 1000)["r1"] == 9
    clock(p).now += 50.0  # step 5: 0.01 x 1.5^5 = 7.6%
    assert 74 <= route(p, router, 1000)["r1"] <= 77
    clock(p).now += 70.0  # past the twelfth step: a full share, round-robin halves
    assert route(p, router, 1000)["r1"] == 500 and not p.outlier.ramping


def test_a_ramping_replica_is_never_sat_out_where_no_one_else_serves_its_model() -> None:
    p = pool(models=(("m",), ("m", "x")))
    p.probe_failed(p["r1"], "down")
    p.probe_passed(p["r1"])
    assert snapshot(p, "r1") == (True, True)
    # Alone in the fleet but for another returning replica: nothing to sit out for either.
    q = pool()
    for name in ("r0", "r1"):
        q.probe_failed(q[name], "down")
        q.probe_passed(q[name])
    assert snapshot(q, "r0") == (True, True) and snapshot(q, "r1") == (True, True)


def test_the_last_routable_replica_is_never_ejected() -> None:
    p = pool()
    p.probe_failed(p["r1"], "down")
    fail(p, "r0", times=10, detail="CUDA out of memory")
    assert p["r0"].healthy and not p.outlier.ejected("r0")


def test_ejections_and_ramps_are_in_the_metrics() -> None:
    p = pool(n=3)
    metrics = GatewayMetrics(p.live_rows)
    fail(p, "r0", times=3)
    fail(p, "r2", detail="torch.OutOfMemoryError")
    text = metrics.render().decode()
    assert (
        'llm_gateway_outlier_ejections_total{reason="consecutive_failures",replica="r0"} 1.0'
        in text
    )
    # The share cap (half of 3: 1) holds r2 in service, its failure uncounted as an ejection.
    assert 'replica="r2"' not in "".join(
        line for line in text.splitlines() if line.startswith("llm_gateway_outlier_ejections")
    )
    assert 'llm_gateway_replica_ejected{replica="r0"} 1.0' in text
    assert 'llm_gateway_replica_ejected{replica="r1"} 0.0' in text
    clock(p).now += 30.0
    text = metrics.render().decode()
    assert 'llm_gateway_replica_ejected{replica="r0"} 0.0' in text
    assert 'llm_gateway_replica_admit_fraction{replica="r0"} 0.01' in text
    assert 'llm_gateway_replica_admit_fraction{replica="r1"} 1.0' in text


def test_an_attempt_the_client_abandoned_is_neither_a_success_nor_a_failure() -> None:
    p = pool()
    fail(p, "r0", times=2)
    p.acquire("r0").release(None)  # the client left: says nothing about the replica
    assert p["r0"].healthy and p["r0"].requests_total == 3 and p["r0"].errors_total == 2
    fail(p, "r0")
    assert p.outlier.ejected("r0")
