"""Fixtures: a real redis-server, a simulated fleet, gateways sharing state through it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.config import GatewayConfig, HealthCheckConfig
from gateway.shared_state.config import SharedStateConfig
from simulator import SimFleet
from tests.gateway.conftest import SIM, InProcessGateway, gateway_config, in_process
from tests.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def fleet4() -> AsyncIterator[SimFleet]:
    async with SimFleet(SIM, replicas=4, host="127.0.0.1", base_port=0) as f:
        yield f


def shared_config(fleet: SimFleet, redis: RedisServer, **shared: object) -> GatewayConfig:
    """A gateway over `fleet` sharing state through `redis` (shared: [shared_state] keys)."""
    base = gateway_config(fleet, health_check=HealthCheckConfig(interval_s=5.0, timeout_s=1.0))
    return replace(base, shared_state=SharedStateConfig(url=redis.url, **shared))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def gateways(cfg: GatewayConfig, n: int = 2) -> AsyncIterator[list[InProcessGateway]]:
    """`n` gateway processes (in-process runtimes) with one configuration."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(in_process(cfg)) for _ in range(n)]
