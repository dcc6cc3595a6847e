"""Client-chosen request ids never collide in the admission queue: it keys tickets itself."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from cache_index.admission_queue import Ticket
from gateway.config import AdmissionConfig
from gateway.proxy.admission import Admission
from routing import Decision, Saturated
from simulator import SimFleet
from tests.gateway.conftest import MODEL, eventually, hold, in_flight
from tests.gateway.proxy.test_admission import DECISION, FEATURES, HOLD, QUICK, _gateway, _queued


async def test_two_waiters_with_one_request_id_both_wait_and_are_served() -> None:
    admission = Admission(AdmissionConfig())
    queue, push = admission.queue, admission.queue.push
    pushes = 0
    both_pushed = asyncio.Event()

    def counting_push(*args: Any, **kwargs: Any) -> Ticket:
        nonlocal pushes
        pushes += 1
        if pushes == 2:
            both_pushed.set()
        return push(*args, **kwargs)

    queue.push = counting_push  # type: ignore[method-assign]
    open_ = False

    def route() -> Decision:
        if not open_:
            raise Saturated(MODEL, "filter 'saturation' removed every replica")
        return DECISION

    # The same client id (FEATURES.request_id) on both.
    tasks = [asyncio.create_task(admission.admit(FEATURES, route)) for _ in range(2)]
    await both_pushed.wait()  # each ran on to its push, then to its wait
    assert len(queue) == 2 and not any(t.done() for t in tasks)
    open_ = True
    admission.notify()  # the first, once routed, wakes the next itself
    assert await asyncio.gather(*tasks) == [(DECISION, True), (DECISION, True)]
    assert len(queue) == 0 and admission.admitted_after_wait == 2


async def test_queued_requests_sharing_an_x_request_id_are_all_served(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        same = {"x-request-id": "client-id-1"}
        waiting = [
            asyncio.create_task(c.post("/v1/chat/completions", json=QUICK, headers=same))
            for _ in range(2)
        ]
        await eventually(lambda: _queued(gw) == 2, what="both queued")
        release.set()
        for r in await asyncio.gather(*waiting):
            assert r.status_code == 200, r.text
            assert r.headers["x-request-id"] == "client-id-1"  # still the client's id
        await asyncio.gather(*holders)
        await eventually(lambda: sum(in_flight(gw).values()) == 0, what="in-flight back to 0")
