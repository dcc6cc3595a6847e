"""Tier 3: requests wait in the admission queue while every replica is saturated."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.config import AdmissionConfig, ScoreLoopConfig
from gateway.process import RunningGateway, running_gateway
from gateway.proxy.admission import Admission
from routing import (
    Branch,
    Decision,
    NoReplicaError,
    ReplicaSnapshot,
    RequestFeatures,
    Saturated,
)
from simulator import SimFleet
from tests.gateway.conftest import (
    MODEL,
    ONE_EACH,
    eventually,
    gateway_config,
    hold,
    holding,
    in_flight,
)

HOLD = holding(2000)
QUICK = {"model": MODEL, "messages": [{"role": "user", "content": "quick"}], "max_tokens": 4}


@asynccontextmanager
async def _gateway(fleet: SimFleet, **admission: object) -> AsyncIterator[RunningGateway]:
    cfg = gateway_config(
        fleet,
        routing=ONE_EACH,
        admission=AdmissionConfig(**admission),  # type: ignore[arg-type]
        score_loop=ScoreLoopConfig(scrape_interval_s=30.0),
    )
    async with running_gateway(cfg) as gw:
        yield gw


def _queued(gw: RunningGateway) -> int:
    assert gw.runtime.admission is not None
    return len(gw.runtime.admission.queue)


async def test_waits_until_a_slot_frees_then_is_served(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        waiting = asyncio.create_task(c.post("/v1/chat/completions", json=QUICK))
        await eventually(lambda: _queued(gw) == 1, what="request queued")
        text = (await c.get("/metrics")).text
        assert 'llm_request_queue_depth{bucket="le128",model="sim-llama-3-8b"} 1.0' in text
        assert not waiting.done()
        release.set()  # one holder ends: its slot goes to the queued request
        r = await waiting
        assert r.status_code == 200
        await asyncio.gather(*holders)
        assert _queued(gw) == 0
        assert 'branch="queued"' in (await c.get("/metrics")).text
        await eventually(lambda: sum(in_flight(gw).values()) == 0, what="in-flight back to 0")


async def test_wait_past_deadline_is_429_with_retry_after(fleet: SimFleet) -> None:
    async with (
        _gateway(fleet, max_wait_s=0.3) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as c,
    ):
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        r = await c.post("/v1/chat/completions", json=QUICK)
        assert r.status_code == 429
        assert r.json()["error"]["type"] == "RateLimitError"
        assert int(r.headers["retry-after"]) >= 1
        assert _queued(gw) == 0
        release.set()
        await asyncio.gather(*holders)


async def test_full_queue_is_429_at_once(fleet: SimFleet) -> None:
    async with _gateway(fleet, max_depth=1) as gw, httpx.AsyncClient(base_url=gw.url) as c:
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        first = asyncio.create_task(c.post("/v1/chat/completions", json=QUICK, timeout=30))
        await eventually(lambda: _queued(gw) == 1, what="first queued")
        r = await c.post("/v1/chat/completions", json=QUICK)
        assert r.status_code == 429 and "retry-after" in r.headers
        release.set()
        assert (await first).status_code == 200
        await asyncio.gather(*holders)


async def test_client_leaving_the_queue_frees_its_place(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        waiting = asyncio.create_task(c.post("/v1/chat/completions", json=QUICK))
        await eventually(lambda: _queued(gw) == 1, what="request queued")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await eventually(lambda: _queued(gw) == 0, what="ticket removed")
        release.set()
        await asyncio.gather(*holders)
        await eventually(lambda: sum(in_flight(gw).values()) == 0, what="in-flight back to 0")


FEATURES = RequestFeatures(model=MODEL, request_id="req-1", bucket="le128")
DECISION = Decision(
    ReplicaSnapshot("r", "http://r.test", frozenset({MODEL})), Branch.MAX_SCORE, 1.0, {}, 1
)


async def test_saturated_waits_in_the_queue_until_woken() -> None:
    admission = Admission(AdmissionConfig())
    refused = asyncio.Event()

    def route() -> Decision:
        if not refused.is_set():
            refused.set()
            raise Saturated(MODEL, "filter 'saturation' removed every replica")
        return DECISION

    task = asyncio.create_task(admission.admit(FEATURES, route))
    await refused.wait()  # admit ran on to its wait: the ticket is in the queue
    assert len(admission.queue) == 1 and not task.done()
    admission.notify()
    assert await task == (DECISION, True)
    assert len(admission.queue) == 0 and admission.admitted_after_wait == 1


async def test_other_no_replica_errors_are_not_queued() -> None:
    admission = Admission(AdmissionConfig())

    def route() -> Decision:
        raise NoReplicaError(MODEL, "filter 'healthy' removed every replica")

    with pytest.raises(NoReplicaError) as info:
        await admission.admit(FEATURES, route)
    assert not isinstance(info.value, Saturated)
    assert len(admission.queue) == 0
