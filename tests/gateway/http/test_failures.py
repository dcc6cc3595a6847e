"""Failure paths: retries before the first byte, broken streams, disconnects, exact in-flight.

Retries and error shapes run in-process (the replicas' faults are real, on sockets); broken
streams and disconnects go through uvicorn: what they check happens on the client's socket.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import orjson
import pytest

from gateway.config import HealthCheckConfig, RoutingConfig, UpstreamConfig
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import (
    MODEL,
    STORY,
    InProcessGateway,
    eventually,
    gateway_config,
    idle,
    in_process,
    set_faults,
)

LONG = {**STORY, "max_tokens": 4000, "ignore_eos": True, "stream": True}


def _slow_health(fleet: SimFleet, **upstream: object) -> object:
    # Passive failure detection and slow probes: these tests watch retries, not health checks.
    # Round-robin: every replica gets traffic, whatever the cache affinity would prefer.
    return gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        health_check=HealthCheckConfig(interval_s=30.0, passive_failure_threshold=100),
        upstream=replace(UpstreamConfig(connect_timeout_s=1.0), **upstream),
    )


def _retries(gw: RunningGateway | InProcessGateway) -> str:
    return gw.runtime.metrics.render().decode()


@pytest.mark.parametrize(
    "fault",
    [{"reset_before_first_byte": True}, {"error_rate": 1.0, "error_status": 503}, {"dead": True}],
)
async def test_failure_before_first_byte_is_retried_elsewhere(fleet: SimFleet, fault: dict) -> None:
    async with in_process(_slow_health(fleet)) as gw:
        c = gw.client
        # Broken after start-up: only live traffic can notice before the next (distant) probe.
        await set_faults(fleet.replicas[0].url, **fault)
        for stream in (False, True):
            for _ in range(4):  # whichever replica is picked first, every request succeeds
                r = await c.post("/v1/chat/completions", json={**STORY, "stream": stream})
                assert r.status_code == 200
                assert r.text.endswith("data: [DONE]\n\n") == stream
        assert idle(gw)
        assert "llm_gateway_upstream_retries_total{reason=" in _retries(gw)
        assert gw.runtime.pool["sim-1"].errors_total == 0


async def test_all_replicas_failing_gives_502_without_upstream_detail(fleet: SimFleet) -> None:
    for r in fleet.replicas:
        await set_faults(r.url, error_rate=1.0, error_status=500)
    async with in_process(_slow_health(fleet, max_retries=5)) as gw:
        r = await gw.client.post("/v1/chat/completions", json=STORY)
        assert r.status_code == 502
        err = r.json()["error"]
        assert err["type"] == "BadGatewayError" and err["code"] == 502
        for replica in fleet.replicas:
            assert replica.url.split("//")[1] not in r.text
        # Never the same replica twice: two replicas, two attempts, even with 5 retries allowed.
        assert sum(rep.errors_total for rep in gw.runtime.pool) == 2
        assert idle(gw)


# With no retry budget at all too: a refused connection cost the replica nothing, so its
# retry is exempt (the budget guards against retries multiplying the replicas' load).
@pytest.mark.parametrize("budget", [{}, {"retry_budget_ratio": 0.0, "min_retry_concurrency": 0}])
async def test_connection_refused_is_retried(fleet: SimFleet, budget: dict[str, float]) -> None:
    cfg = _slow_health(fleet, **budget)
    async with in_process(cfg) as gw:
        c = gw.client
        await fleet.replicas[0].stop()
        for _ in range(4):
            assert (
                await c.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}
                )
            ).status_code == 200
        assert idle(gw)


async def test_failure_after_first_byte_ends_with_error_event_and_no_done(fleet: SimFleet) -> None:
    for r in fleet.replicas:
        await set_faults(r.url, reset_after_tokens=3)
    async with running_gateway(_slow_health(fleet)) as gw, httpx.AsyncClient(base_url=gw.url) as c:
        async with c.stream(
            "POST", "/v1/chat/completions", json={**STORY, "max_tokens": 20, "stream": True}
        ) as r:
            assert r.status_code == 200
            raw = b"".join([x async for x in r.aiter_raw()])
        assert b"[DONE]" not in raw
        last = raw.rstrip(b"\n").split(b"\n\n")[-1]
        assert last.startswith(b"data: ")
        err = orjson.loads(last[6:])["error"]
        assert err["code"] == 502 and "127.0.0.1" not in err["message"]
        # Not retried: exactly one replica saw the request.
        assert sum(rep.requests_total for rep in gw.runtime.pool) == 1
        assert idle(gw)
        assert "llm_gateway_streams_truncated_total" in _retries(gw)


async def test_idle_timeout_between_chunks(fleet: SimFleet) -> None:
    for r in fleet.replicas:
        await set_faults(r.url, stall_after_tokens=2, stall_seconds=3.0)
    async with (
        running_gateway(_slow_health(fleet, idle_timeout_s=0.3)) as gw,
        httpx.AsyncClient(base_url=gw.url) as c,
    ):
        async with c.stream(
            "POST", "/v1/chat/completions", json={**STORY, "max_tokens": 20, "stream": True}
        ) as r:
            raw = b"".join([x async for x in r.aiter_raw()])
        assert b"[DONE]" not in raw and b'"error"' in raw
        assert idle(gw)


async def test_first_byte_timeout_is_retried_then_504(fleet: SimFleet) -> None:
    for r in fleet.replicas:
        await set_faults(r.url, stall_seconds=3.0)
    cfg = _slow_health(fleet, first_byte_timeout_s=0.3, non_stream_timeout_s=0.3)
    async with in_process(cfg) as gw:
        r = await gw.client.post("/v1/chat/completions", json={**STORY, "stream": True})
        assert r.status_code == 504 and r.json()["error"]["type"] == "GatewayTimeoutError"
        assert idle(gw)


async def _running(fleet: SimFleet) -> int:
    return sum(r.engine.num_running + r.engine.num_waiting for r in fleet.replicas)


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_frees_the_replica_slot(fleet: SimFleet, stream: bool) -> None:
    async with running_gateway(_slow_health(fleet)) as gw:
        body = {**LONG, "stream": stream}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            if stream:
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for _ in r.aiter_raw():
                        break  # first chunk seen: the request is running upstream
            else:
                task = asyncio.create_task(c.post("/v1/chat/completions", json=body))
                await eventually(lambda: sum(r.engine.num_running for r in fleet.replicas) == 1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        await eventually(
            lambda: sum(r.engine.num_running + r.engine.num_waiting for r in fleet.replicas) == 0,
            timeout=1.0,
            what="replica running count back to 0",
        )
        await eventually(lambda: idle(gw), timeout=1.0, what="in-flight back to 0")


async def test_client_disconnect_before_first_token(fleet: SimFleet) -> None:
    for r in fleet.replicas:
        await set_faults(r.url, stall_seconds=5.0)
    async with running_gateway(_slow_health(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            task = asyncio.create_task(c.post("/v1/chat/completions", json=LONG))
            await eventually(lambda: not idle(gw), what="request in flight")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await eventually(lambda: idle(gw), timeout=1.0, what="in-flight back to 0")
        await eventually(
            lambda: sum(r.engine.num_running + r.engine.num_waiting for r in fleet.replicas) == 0,
            timeout=1.0,
            what="replica running count back to 0",
        )


async def test_passive_failures_mark_a_replica_down(fleet: SimFleet) -> None:
    await set_faults(fleet.replicas[0].url, error_rate=1.0, error_status=500)
    cfg = gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        health_check=HealthCheckConfig(interval_s=30.0, passive_failure_threshold=2),
    )
    async with in_process(cfg) as gw:
        for _ in range(6):
            assert (await gw.client.post("/v1/chat/completions", json=STORY)).status_code == 200
        assert not gw.runtime.pool["sim-0"].healthy
        assert gw.runtime.pool["sim-0"].errors_total == 2
        assert idle(gw)


async def test_health_check_thresholds(fleet: SimFleet) -> None:
    cfg = gateway_config(
        fleet,
        health_check=HealthCheckConfig(interval_s=0.05, unhealthy_threshold=3, healthy_threshold=2),
    )
    async with in_process(cfg) as gw:
        sim0 = gw.runtime.pool["sim-0"]
        # Start-up probes once; the second good probe (threshold 2) marks it up.
        assert not sim0.healthy
        await eventually(lambda: sim0.healthy, what="sim-0 up after 2 probes")
        await set_faults(fleet.replicas[0].url, unhealthy=True)
        await eventually(lambda: not sim0.healthy, what="sim-0 down")
        assert sim0.consecutive_failures >= 3
        await set_faults(fleet.replicas[0].url, unhealthy=False)
        await eventually(lambda: sim0.healthy, what="sim-0 up")
        assert gw.runtime.pool["sim-1"].healthy
