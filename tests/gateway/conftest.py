"""Fixtures: a simulated fleet on ephemeral ports and a gateway in front of it.

The gateway runs in-process behind httpx's ASGI transport unless a test is about sockets
(disconnects, drain, stream timing, gRPC, KV events): then uvicorn serves it on a port.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import httpx
import pytest

from gateway.config import (
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    RoutingConfig,
    ServerConfig,
    UpstreamConfig,
)
from gateway.http.app import GatewayApp
from gateway.process import RunningGateway, running_gateway
from gateway.runtime import Runtime
from routing import PluginSpec, ProfileSpec
from simulator import SimConfig, SimFleet

MODEL = "sim-llama-3-8b"
LORA = "sim-lora"
# Fast clock: a 16-token answer takes a few milliseconds of wall time.
SIM = SimConfig(model=MODEL, lora_adapters=(LORA,), time_scale=20.0, kv_events=False, seed=7)
# A short chat either replica of the fleet answers in a few milliseconds.
STORY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a story"}],
    "max_tokens": 8,
}


def one_in_flight(
    picker: PluginSpec, scorers: tuple[PluginSpec, ...] = (), name: str = "one_each"
) -> RoutingConfig:
    """A profile holding each replica to one request in flight: with all busy, the next queues."""
    saturation = PluginSpec("saturation", params={"max_in_flight": 1})
    filters = (PluginSpec("healthy"), PluginSpec("serves_model"), saturation)
    spec = ProfileSpec(picker=picker, filters=filters, scorers=scorers, name=name)
    return RoutingConfig(profile=name, profiles={name: spec})


# One request in flight per replica, least loaded first: of three at once on two, one queues.
ONE_EACH = one_in_flight(PluginSpec("max_score"), (PluginSpec("least_inflight"),))


def holding(max_tokens: int, model: str = MODEL) -> dict[str, object]:
    """A streamed chat that holds its replica's slot for `max_tokens` tokens (no early EOS)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hold this slot"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def hold(
    c: httpx.AsyncClient,
    body: dict[str, object],
    release: asyncio.Event,
    started: list[int] | None = None,
) -> None:
    """Stream `body` (see `holding`) until `release` is set; `started` gets a 1 at its head."""
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        if started is not None:
            started.append(1)  # a status line means the first token came: TTFT is observed
        async for _ in r.aiter_raw():
            if release.is_set():
                return


async def eventually(
    predicate: Callable[[], bool],
    timeout: float = 3.0,  # noqa: ASYNC109 - a polling deadline, not a cancel scope
    what: str = "condition",
) -> None:
    """Poll `predicate` until true; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def gateway_config(fleet: SimFleet, **overrides: object) -> GatewayConfig:
    base = GatewayConfig(
        server=ServerConfig(port=0),
        upstream=UpstreamConfig(connect_timeout_s=1.0),
        health_check=HealthCheckConfig(interval_s=0.1, timeout_s=0.5),
        replicas=tuple(ReplicaConfig(url=r.url, name=r.name) for r in fleet.replicas),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(SIM, replicas=2, host="127.0.0.1", base_port=0) as f:
        yield f


@pytest.fixture
async def gateway(fleet: SimFleet) -> AsyncIterator[RunningGateway]:
    async with running_gateway(gateway_config(fleet)) as gw:
        yield gw


@pytest.fixture
async def client(gateway: RunningGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10.0) as c:
        yield c


@dataclass
class InProcessGateway:
    """A started runtime and a client calling its ASGI app directly: no gateway socket."""

    runtime: Runtime
    client: httpx.AsyncClient


@contextlib.asynccontextmanager
async def in_process(cfg: GatewayConfig) -> AsyncIterator[InProcessGateway]:
    """The gateway of `cfg` without uvicorn; the hop to the replicas stays real.

    httpx's ASGI transport buffers a response until the app is done: good for status, headers
    and bodies, not for watching a stream arrive or for a client that leaves mid-request.
    """
    runtime = Runtime(cfg)
    await runtime.start()
    try:
        transport = httpx.ASGITransport(app=GatewayApp(runtime))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=10.0
        ) as c:
            yield InProcessGateway(runtime, c)
    finally:
        await runtime.stop()


@pytest.fixture
async def asgi_gateway(fleet: SimFleet) -> AsyncIterator[InProcessGateway]:
    async with in_process(gateway_config(fleet)) as gw:
        yield gw


@pytest.fixture
def asgi_client(asgi_gateway: InProcessGateway) -> httpx.AsyncClient:
    return asgi_gateway.client


def in_flight(gw: RunningGateway | InProcessGateway) -> dict[str, int]:
    return {r.name: r.in_flight for r in gw.runtime.pool}


def idle(gw: RunningGateway | InProcessGateway) -> bool:
    """Nothing in flight to any replica: every lease released."""
    return not any(r.in_flight for r in gw.runtime.pool)


async def set_faults(url: str, **faults: object) -> None:
    async with httpx.AsyncClient(timeout=5.0) as c:
        r = await c.post(url + "/_sim/faults", json=faults)
        r.raise_for_status()
