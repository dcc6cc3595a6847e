"""The retry budget: retries in flight stay within a share of the active requests."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from gateway.config import GatewayConfig, RoutingConfig, UpstreamConfig
from gateway.errors import GatewayError, UpstreamFailed
from gateway.proxy.requests import ParsedRequest, parse_request
from gateway.replicas.outlier import OutlierConfig
from tests.gateway.fake_upstream import (
    Answer,
    FakeUpstream,
    PipelineRig,
    pipeline_rig,
    replica_configs,
)

MODEL = "m"
FAIL, HANG = Answer(status=503), Answer(hang="headers")
# Outlier ejection off: these tests count retries, and ejections would change the candidates.
NO_EJECTION = OutlierConfig(consecutive_failures=0, failure_rate=0.0, oom_patterns=())


def rig(answers: list[Answer], ratio: float, minimum: int) -> PipelineRig:
    cfg = GatewayConfig(
        upstream=UpstreamConfig(
            max_retries=1, retry_budget_ratio=ratio, min_retry_concurrency=minimum
        ),
        routing=RoutingConfig(profile="round_robin"),
        outlier=NO_EJECTION,
        replicas=replica_configs(3, MODEL),
    )
    return pipeline_rig(FakeUpstream(sequence=answers), cfg)


def chat() -> ParsedRequest:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return parse_request("chat", orjson.dumps(body), "rid")


async def hung(r: PipelineRig, n: int) -> list[asyncio.Task[object]]:
    """`n` requests left waiting on a replica that never answers (each after its script)."""
    tasks: list[asyncio.Task[object]] = []
    for _ in range(n):
        r.upstream.waiting.clear()
        tasks.append(asyncio.create_task(r.pipeline.open(chat(), [], time.perf_counter())))
        await asyncio.wait_for(r.upstream.waiting.wait(), timeout=5.0)
    return tasks


async def refused(r: PipelineRig) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await r.pipeline.open(chat(), [], time.perf_counter())
    return info.value


async def cancel(tasks: list[asyncio.Task[object]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def refusals(r: PipelineRig) -> float:
    return r.sample("llm_gateway_retries_refused_total")


async def test_min_retry_concurrency_retries_may_be_in_flight_whatever_the_ratio() -> None:
    # Two requests fail, then wait in their retries; the third's retry would be one too many.
    r = rig([FAIL, HANG, FAIL, HANG, FAIL], ratio=0.0, minimum=2)
    waiting = await hung(r, 2)
    err = await refused(r)
    # The last error is the answer: the replica's 503, not a budget error of our own.
    assert isinstance(err, UpstreamFailed) and err.status == 503
    assert len(r.upstream.calls) == 5 and refusals(r) == 1.0
    await cancel(waiting)
    assert r.idle()


async def test_the_budget_is_a_share_of_the_active_requests() -> None:
    # Alone, a failing request may not retry: 20% of 1 active request is no whole retry.
    r = rig([FAIL], ratio=0.2, minimum=0)
    assert (await refused(r)).status == 503 and refusals(r) == 1.0
    # Beside 4 requests in flight, 20% of 5 is one retry; a second one at once is refused.
    r = rig([HANG] * 4 + [FAIL, HANG, FAIL], ratio=0.2, minimum=0)
    waiting = await hung(r, 5)
    assert refusals(r) == 0.0 and len(r.upstream.calls) == 6  # the fifth retried
    assert (await refused(r)).status == 503 and refusals(r) == 1.0
    assert len(r.upstream.calls) == 7
    await cancel(waiting)
    assert r.idle()


async def test_a_retry_that_ended_frees_its_place_in_the_budget() -> None:
    r = rig([FAIL, Answer(), FAIL, Answer()], ratio=0.0, minimum=1)
    for _ in range(2):  # one after the other: each retry is the only one in flight
        exchange = await r.pipeline.open(chat(), [], time.perf_counter())
        assert exchange.status == 200
        r.pipeline.finish(chat(), exchange, 200, True)
    assert refusals(r) == 0.0 and r.idle()


async def test_a_refused_connection_is_retried_whatever_the_budget() -> None:
    # The budget keeps retries from multiplying the replicas' load; a refused connection
    # (a dead replica's port) put none on them, so its retry goes even with no budget at all.
    r = rig([Answer(refuse=ConnectionRefusedError), Answer()], ratio=0.0, minimum=0)
    exchange = await r.pipeline.open(chat(), [], time.perf_counter())
    assert exchange.status == 200 and refusals(r) == 0.0
    r.pipeline.finish(chat(), exchange, 200, True)
    # A reset is not exempt: the replica may have started on the request.
    r = rig([Answer(refuse=ConnectionResetError), Answer()], ratio=0.0, minimum=0)
    err = await refused(r)
    assert isinstance(err, UpstreamFailed) and refusals(r) == 1.0
    assert len(r.upstream.calls) == 1 and r.idle()
