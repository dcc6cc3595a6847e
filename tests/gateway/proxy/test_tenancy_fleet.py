"""Tenants over real sockets in front of a saturated simulated fleet: fair, strict, limited.

Dispatch order is read from the decision log (one line per routing decision, in order), so
the tests assert who went first, never how long anything took.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc
import httpx
import pytest

from gateway.config import AdmissionConfig, ScoreLoopConfig, ServerConfig
from gateway.grpc.config import GrpcConfig
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.gen import gateway_pb2_grpc as pb_grpc
from gateway.grpc.server import running_grpc
from gateway.http.app import GatewayApp
from gateway.process import RunningGateway, running_gateway
from gateway.proxy.tenancy_config import TenancyConfig, TenantConfig
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, eventually, gateway_config, in_flight
from tests.gateway.proxy.test_admission import HOLD, ONE_EACH, QUICK

# Slower than the shared fleet: a held stream outlasts the setup of a 40-request flood.
SLOW = replace(SIM, time_scale=2.0)
HELD = {**HOLD, "max_tokens": 4000}
REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: never this host


@pytest.fixture
async def slow_fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(SLOW, replicas=2, host="127.0.0.1", base_port=0) as f:
        yield f


def _key(name: str, rid: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"authorization": f"Bearer {name}-key", **extra}
    if rid is not None:
        headers["x-request-id"] = rid
    return headers


async def _post(c: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    return await c.post("/v1/chat/completions", json=QUICK, headers=headers)


def _tenants(**tenants: TenantConfig) -> dict[str, TenantConfig]:
    return {name: replace(t, keys=(f"{name}-key",)) for name, t in tenants.items()}


@asynccontextmanager
async def _gateway(
    fleet: SimFleet, tenancy: TenancyConfig, admission: AdmissionConfig | None = None
) -> AsyncIterator[RunningGateway]:
    cfg = gateway_config(
        fleet,
        routing=ONE_EACH,  # one request per replica: the third concurrent one queues
        score_loop=ScoreLoopConfig(scrape_interval_s=30.0),
        tenancy=tenancy,
        server=ServerConfig(port=0),
        admission=admission or AdmissionConfig(),
    )
    async with running_gateway(cfg) as gw:
        yield gw


def _queued(gw: RunningGateway) -> int:
    assert gw.runtime.admission is not None
    return len(gw.runtime.admission.queue)


class _Holder:
    """A stream that keeps its replica's one slot until released."""

    def __init__(self, c: httpx.AsyncClient, headers: dict[str, str]) -> None:
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run(c, headers))

    async def _run(self, c: httpx.AsyncClient, headers: dict[str, str]) -> None:
        async with c.stream("POST", "/v1/chat/completions", json=HELD, headers=headers) as r:
            assert r.status_code == 200
            async for _ in r.aiter_raw():
                if self.release.is_set():
                    return


def _dispatched(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Request ids of the requests woken from the queue, in the order they were routed."""
    out = []
    for record in caplog.records:
        if record.name == "llm_gateway.decision":
            fields = dict(kv.split("=", 1) for kv in record.getMessage().split(" ") if "=" in kv)
            if fields.get("branch") == "queued":
                out.append(fields["request_id"])
    return out


async def test_a_polite_tenant_is_served_ahead_of_a_greedy_tenants_backlog(
    slow_fleet: SimFleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llm_gateway.decision")
    tenancy = TenancyConfig(tenants=_tenants(greedy=TenantConfig(), polite=TenantConfig()))
    async with (
        _gateway(slow_fleet, tenancy) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60) as c,
    ):
        holders = [_Holder(c, _key("greedy", f"hold{i}")) for i in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        flood = [
            asyncio.create_task(
                c.post(
                    "/v1/chat/completions",
                    json={**QUICK, "stream": True},
                    headers=_key("greedy", f"g{i}"),
                )
            )
            for i in range(38)
        ]
        await eventually(lambda: _queued(gw) == 38, timeout=10, what="the flood queued")
        polite = [
            asyncio.create_task(
                c.post("/v1/chat/completions", json=QUICK, headers=_key("polite", f"p{i}"))
            )
            for i in range(3)
        ]
        await eventually(lambda: _queued(gw) == 41, what="the polite requests queued")
        depth = (await c.get("/metrics")).text
        assert 'llm_gateway_tenant_queue_depth{tenant="greedy"} 38.0' in depth
        assert 'llm_gateway_tenant_queue_depth{tenant="polite"} 3.0' in depth
        for h in holders:
            h.release.set()
        for r in await asyncio.gather(*flood, *polite, *(h.task for h in holders)):
            if r is not None:
                assert r.status_code == 200
        order = _dispatched(caplog)
        assert sorted(order) == sorted([f"g{i}" for i in range(38)] + ["p0", "p1", "p2"])
        last_polite = max(order.index(f"p{i}") for i in range(3))
        # Equal weights alternate: all three are out within the first six (FIFO: the last 3).
        assert last_polite <= 6, order
        await eventually(lambda: sum(in_flight(gw).values()) == 0, what="in-flight back to 0")


async def test_a_p0_request_under_a_p2_flood_takes_the_next_free_slot(
    slow_fleet: SimFleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llm_gateway.decision")
    # One tenant for flood and urgent request: only the class, not fairness, can put it first.
    tenancy = TenancyConfig(tenants=_tenants(app=TenantConfig(priority=2, max_priority=0)))
    async with (
        _gateway(slow_fleet, tenancy) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60) as c,
    ):
        holders = [_Holder(c, _key("app", f"hold{i}")) for i in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        flood = [
            asyncio.create_task(
                c.post("/v1/chat/completions", json=QUICK, headers=_key("app", f"w{i}"))
            )
            for i in range(10)
        ]
        await eventually(lambda: _queued(gw) == 10, what="the P2 flood queued")
        urgent = asyncio.create_task(_post(c, _key("app", "urgent", **{"x-priority": "P0"})))
        await eventually(lambda: _queued(gw) == 11, what="the P0 request queued")
        holders[0].release.set()  # one slot frees
        assert (await urgent).status_code == 200
        assert _dispatched(caplog)[0] == "urgent"
        holders[1].release.set()
        for r in await asyncio.gather(*flood):
            assert r.status_code == 200
        await asyncio.gather(*(h.task for h in holders))


async def test_one_tenant_filling_its_queue_leaves_room_for_the_others(
    slow_fleet: SimFleet,
) -> None:
    tenancy = TenancyConfig(tenants=_tenants(greedy=TenantConfig(), polite=TenantConfig()))
    async with (
        _gateway(slow_fleet, tenancy, AdmissionConfig(max_depth=2)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60) as c,
    ):
        holders = [_Holder(c, _key("greedy")) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        queued = [asyncio.create_task(_post(c, _key("greedy"))) for _ in range(2)]
        await eventually(lambda: _queued(gw) == 2, what="greedy's queue full")
        r = await _post(c, _key("greedy"))
        assert r.status_code == 429 and "retry-after" in r.headers
        assert "this tenant's" in r.json()["error"]["message"]
        polite = asyncio.create_task(_post(c, _key("polite")))
        await eventually(lambda: _queued(gw) == 3, what="polite queued all the same")
        for h in holders:
            h.release.set()
        for r in await asyncio.gather(polite, *queued):
            assert r.status_code == 200
        await asyncio.gather(*(h.task for h in holders))


async def test_a_tenant_over_its_quota_gets_429_while_another_is_served(fleet: SimFleet) -> None:
    tenancy = TenancyConfig(
        tenants=_tenants(
            limited=TenantConfig(requests_per_minute=2),
            single=TenantConfig(max_concurrent=1),
            free=TenantConfig(),
        )
    )
    async with _gateway(fleet, tenancy) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        for _ in range(2):
            r = await c.post("/v1/chat/completions", json=QUICK, headers=_key("limited"))
            assert r.status_code == 200
        r = await c.post("/v1/chat/completions", json=QUICK, headers=_key("limited"))
        assert r.status_code == 429
        err = r.json()["error"]
        assert err["type"] == "RateLimitError" and err["code"] == 429
        assert "requests_per_minute" in err["message"]
        assert 25 <= int(r.headers["retry-after"]) <= 30  # one request refills in 30 s
        assert (
            await c.post("/v1/chat/completions", json=QUICK, headers=_key("free"))
        ).status_code == 200
        # Concurrency: a held stream takes the tenant's only slot.
        holder = _Holder(c, _key("single"))
        await eventually(lambda: sum(in_flight(gw).values()) == 1, what="the stream running")
        r = await c.post("/v1/chat/completions", json=QUICK, headers=_key("single"))
        assert r.status_code == 429 and "max_concurrent" in r.json()["error"]["message"]
        assert "retry-after" in r.headers
        assert (
            await c.post("/v1/chat/completions", json=QUICK, headers=_key("free"))
        ).status_code == 200
        holder.release.set()
        await holder.task
        await eventually(lambda: sum(in_flight(gw).values()) == 0, what="in-flight back to 0")
        r = await c.post("/v1/chat/completions", json=QUICK, headers=_key("single"))
        assert r.status_code == 200  # its slot came back
        text = (await c.get("/metrics")).text
        assert (
            'llm_gateway_quota_refusals_total{limit="requests_per_minute",tenant="limited"} 1.0'
            in text
        )
        assert (
            'llm_gateway_quota_refusals_total{limit="max_concurrent",tenant="single"} 1.0' in text
        )


async def test_x_tenant_id_from_an_untrusted_source_is_ignored(fleet: SimFleet) -> None:
    tenancy = TenancyConfig(
        tenants=_tenants(mallory=TenantConfig(requests_per_minute=1), victim=TenantConfig()),
        trusted_sources=("127.0.0.1/32",),  # a sidecar on this host
    )
    posing = _key("mallory", **{"x-tenant-id": "victim"})
    async with _gateway(fleet, tenancy) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        # Over the socket from loopback: trusted, so the header names the tenant (unlimited).
        for _ in range(2):
            assert (
                await c.post("/v1/chat/completions", json=QUICK, headers=posing)
            ).status_code == 200
        transport = httpx.ASGITransport(app=GatewayApp(gw.runtime), client=REMOTE)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as remote:
            # From anywhere else the header is ignored: mallory's own quota applies.
            assert (
                await remote.post("/v1/chat/completions", json=QUICK, headers=posing)
            ).status_code == 200
            r = await remote.post("/v1/chat/completions", json=QUICK, headers=posing)
            assert r.status_code == 429
            assert "`mallory`" in r.json()["error"]["message"]
            # A header alone opens nothing: the key is still required.
            r = await remote.post(
                "/v1/chat/completions", json=QUICK, headers={"x-tenant-id": "victim"}
            )
            assert r.status_code == 401


@pytest.mark.parametrize("trusted", [False, True])
async def test_grpc_tenants_come_from_keys_and_trusted_peers_only(
    fleet: SimFleet, trusted: bool
) -> None:
    tenancy = TenancyConfig(
        tenants=_tenants(mallory=TenantConfig(requests_per_minute=1), victim=TenantConfig()),
        trusted_sources=("127.0.0.1/32",) if trusted else (),
    )
    req = pb.CompletionRequest(model=MODEL, text="hi", max_tokens=2)
    posing = (("authorization", "Bearer mallory-key"), ("x-tenant-id", "victim"))
    async with (
        _gateway(fleet, tenancy) as gw,
        running_grpc(gw.runtime, GrpcConfig(enabled=True, port=0)) as front,
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        stub = pb_grpc.InferenceStub(channel)  # type: ignore[no-untyped-call]
        await stub.Complete(req, metadata=posing, timeout=10)
        if trusted:  # the peer is this host: the metadata names the tenant, victim's unlimited
            await stub.Complete(req, metadata=posing, timeout=10)
            return
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Complete(req, metadata=posing, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "mallory" in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Complete(req, metadata=(("x-tenant-id", "victim"),), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_tokens_are_charged_from_the_replicas_usage(fleet: SimFleet) -> None:
    # 600 tokens reserved per request (no max_tokens), 1000 a minute; the simulator answers 16.
    tenancy = TenancyConfig(
        tenants=_tenants(t=TenantConfig(tokens_per_minute=1000)), default_completion_tokens=600
    )
    prompt = {"model": MODEL, "prompt": "Once upon a time"}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    async with _gateway(fleet, tenancy) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

        async def post(body: dict[str, object]) -> httpx.Response:
            return await c.post("/v1/completions", json={**prompt, **body}, headers=_key("t"))

        # Settled to ~20 each from the usage chunk, then from the body: both fit in turn.
        assert (await post(usage)).status_code == 200
        assert (await post({})).status_code == 200
        # A stream without a usage chunk keeps its 600: the next 600 no longer fit.
        assert (await post({"stream": True})).status_code == 200
        r = await post({})
        assert r.status_code == 429 and "tokens_per_minute" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
