"""Fixtures: three slower simulated replicas (streams last long enough to be caught open)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from gateway.config import GatewayConfig, HealthCheckConfig, RoutingConfig, ServerConfig
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState
from simulator import SimFleet
from tests.gateway.conftest import SIM, eventually, gateway_config

# About 2 ms a token: a 60-token stream stays open ~0.15 s.
SLOW = replace(SIM, time_scale=4.0)
ADMIN_KEY = "admin-secret"
API_KEY = "sk-data-plane"


@pytest.fixture
async def fleet3() -> AsyncIterator[SimFleet]:
    async with SimFleet(SLOW, replicas=3, host="127.0.0.1", base_port=0) as f:
        yield f


def fleet_config(fleet: SimFleet, first: int = 2, **overrides: object) -> GatewayConfig:
    """The gateway over the fleet's first `first` replicas: round-robin, fast probes."""
    cfg = gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        health_check=HealthCheckConfig(interval_s=0.1, timeout_s=0.5),
        server=ServerConfig(port=0, drain_timeout_s=10.0),
    )
    cfg = replace(cfg, replicas=cfg.replicas[:first])
    return replace(cfg, **overrides)  # type: ignore[arg-type]


def started(replica: ReplicaState) -> int:
    """Requests ever routed to `replica`: finished plus open."""
    return replica.requests_total + replica.in_flight


@contextlib.asynccontextmanager
async def removed_while_busy(pool: ReplicaPool, name: str) -> AsyncIterator[None]:
    """The body makes `name` leave discovery's answer once streams run on it: drained, removed."""
    await eventually(lambda: pool[name].in_flight > 0, what=f"streams on {name}")
    leaving = pool[name]
    yield
    await eventually(lambda: name not in pool.replicas, 15.0, f"{name} removed")
    assert leaving.drained and leaving.in_flight == 0
