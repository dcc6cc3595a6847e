"""/v1/chat/completions/batch through the gateway, over sockets: one JSON answer, routed on
its first conversation's prefix, retried before the first byte, bad shapes refused."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.config import ScoreLoopConfig
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import (
    MODEL,
    ONE_EACH,
    SIM,
    eventually,
    gateway_config,
    hold,
    holding,
    in_flight,
    set_faults,
)

BATCH = "/v1/chat/completions/batch"
_DECISION = re.compile(
    r'^llm_gateway_routing_decisions_total\{branch="([^"]+)",replica="([^"]+)"\} (\S+)$', re.M
)
# Long enough to fill several prefix blocks, so that the prefix tier has something to match.
_SYSTEM = " ".join(f"rule {i} of the house style" for i in range(60))


def _decisions(gw: RunningGateway) -> dict[tuple[str, str], float]:
    text = gw.runtime.metrics.render().decode()
    return {(r, b): float(n) for b, r, n in _DECISION.findall(text)}


def _new(before: dict[tuple[str, str], float], gw: RunningGateway) -> list[tuple[str, str]]:
    after = _decisions(gw)
    return [k for k, n in after.items() if n > before.get(k, 0.0)]


@pytest.fixture
async def two() -> AsyncIterator[tuple[SimFleet, RunningGateway]]:
    fleet = SimFleet(SIM, replicas=2, host="127.0.0.1", base_port=0)
    async with fleet, running_gateway(gateway_config(fleet)) as gw:
        yield fleet, gw


def _conv(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


async def test_batch_through_the_gateway_follows_its_first_conversation(
    two: tuple[SimFleet, RunningGateway],
) -> None:
    _, gw = two
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        first = _conv("the first question")
        r = await c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": first, "max_tokens": 2}
        )
        assert r.status_code == 200, r.text
        (chat_replica, _), *_ = _new({}, gw)
        for round_ in range(3):
            before = _decisions(gw)
            convs = [first, _conv(f"another question {round_}"), _conv("a third")]
            r = await c.post(
                BATCH,
                json={"model": MODEL, "messages": convs, "max_tokens": 3, "stream": True},
                headers={"X-Request-Id": f"b-{round_}"},
            )
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("application/json")
            assert r.headers["x-request-id"] == f"b-{round_}"
            body = r.json()
            assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
            assert body["usage"]["completion_tokens"] == 9
            # Every batch lands where the chat that shares its first conversation did.
            [(replica, branch)] = _new(before, gw)
            assert replica == chat_replica, (replica, branch)
            assert branch != "load", branch


async def test_batch_retried_on_another_replica_before_the_first_byte(
    two: tuple[SimFleet, RunningGateway],
) -> None:
    fleet, gw = two
    await set_faults(fleet.replicas[0].url, error_rate=1.0, error_status=503)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        for i in range(4):
            r = await c.post(
                BATCH,
                json={"model": MODEL, "messages": [_conv(f"q{i}")], "max_tokens": 2},
            )
            assert r.status_code == 200, r.text
            assert len(r.json()["choices"]) == 1


@pytest.mark.parametrize(
    ("messages", "param"),
    [([], "messages"), ([{"role": "user", "content": "x"}], "messages.0"), ([[]], "messages.0")],
)
async def test_batch_shapes_the_gateway_cannot_route_are_refused(
    two: tuple[SimFleet, RunningGateway], messages: object, param: str
) -> None:
    _, gw = two
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        r = await c.post(BATCH, json={"model": MODEL, "messages": messages})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_a_replica_refusal_is_relayed_unchanged(
    two: tuple[SimFleet, RunningGateway],
) -> None:
    fleet, gw = two
    body = {"model": MODEL, "messages": [_conv("q")], "n": 2}
    async with httpx.AsyncClient(timeout=30.0) as c:
        direct = await c.post(fleet.replicas[0].url + BATCH, json=body)
        through = await c.post(gw.url + BATCH, json=body)
    assert direct.status_code == through.status_code == 400
    assert through.json() == direct.json()


async def test_a_batch_waits_in_the_bucket_of_all_its_conversations(fleet: SimFleet) -> None:
    cfg = gateway_config(
        fleet, routing=ONE_EACH, score_loop=ScoreLoopConfig(scrape_interval_s=30.0)
    )
    async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, holding(2000), release)) for _ in range(2)]
        await eventually(lambda: sum(in_flight(gw).values()) == 2, what="both replicas busy")
        # A short first conversation, a long later one (~1,250 tokens): the batch is long.
        convs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "word " * 1000}]]
        waiting = asyncio.create_task(
            c.post(BATCH, json={"model": MODEL, "messages": convs, "max_tokens": 2})
        )
        admission = gw.runtime.admission
        assert admission is not None
        await eventually(lambda: len(admission.queue) == 1, what="batch queued")
        text = gw.runtime.metrics.render().decode()
        assert f'llm_request_queue_depth{{bucket="gt512",model="{MODEL}"}} 1.0' in text
        assert f'llm_request_queue_depth{{bucket="le128",model="{MODEL}"}} 0.0' in text
        release.set()
        r = await waiting
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
        await asyncio.gather(*holders)
