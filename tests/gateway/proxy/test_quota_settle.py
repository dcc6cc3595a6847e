"""Token quotas through the pipeline: reserved at arrival, settled from the answer's usage."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson
import pytest

from gateway.config import GatewayConfig, HealthCheckConfig, RoutingConfig
from gateway.errors import GatewayError
from gateway.proxy.affinity import Affinity
from gateway.proxy.pipeline import Pipeline
from gateway.proxy.quota import Limits, LocalQuotaStore
from gateway.proxy.requests import ParsedRequest, parse_request
from gateway.proxy.tenancy import QuotaExceeded, Tenancy
from gateway.proxy.tenancy_config import TenancyConfig, TenantConfig
from gateway.proxy.upstream import StreamBroken
from gateway.replicas.pool import ReplicaPool
from gateway.runtime import build_router
from telemetry.metrics import GatewayMetrics
from tests.gateway.fake_upstream import Answer, FakeUpstream, replica_configs

TPM = 1000
USAGE = b'"usage":{"prompt_tokens":10,"total_tokens":40,"completion_tokens":30}'
BODY = b'{"id":"x","choices":[{"text":"hi"}],' + USAGE + b"}"
# The usage event split over two reads, as a TCP segment boundary may cut it.
EVENT = b"data: {" + USAGE + b',"choices":[]}\n\n'
STREAM = (b"data: {}\n\n", EVENT[:20], EVENT[20:], b"data: [DONE]\n\n")


def _setup(upstream: FakeUpstream) -> tuple[Pipeline, Tenancy, LocalQuotaStore]:
    cfg = GatewayConfig(
        health_check=HealthCheckConfig(passive_failure_threshold=100),
        routing=RoutingConfig(profile="round_robin"),
        replicas=replica_configs(2, "m"),
        tenancy=TenancyConfig(tenants={"t": TenantConfig(tokens_per_minute=TPM)}),
    )
    pool = ReplicaPool.from_configs(cfg.replicas)
    for r in pool:
        r.healthy = True
    metrics = GatewayMetrics(pool.live_rows)
    store = LocalQuotaStore()
    # A frozen clock: no refill between requests, so the budget shows exactly what was charged.
    tenancy = Tenancy(cfg.tenancy, store=store, clock=lambda: 0.0)
    affinity = Affinity(cfg.cache_index, pool.is_lora)
    pipeline = Pipeline(
        cfg, pool, build_router(cfg), upstream, metrics, affinity, None, None, tenancy
    )
    return pipeline, tenancy, store


def _req(stream: bool, max_tokens: int = 500) -> ParsedRequest:
    body = {"model": "m", "prompt": "x" * 400, "max_tokens": max_tokens, "stream": stream}
    req = parse_request("completions", orjson.dumps(body), "r")
    return replace(req, features=replace(req.features, tenant="t"))


async def _serve(pipeline: Pipeline, req: ParsedRequest) -> None:
    exchange = await pipeline.open(req, [], time.perf_counter())
    ok = True
    try:
        async for _ in exchange.chunks():
            pass
    except StreamBroken:
        ok = False
    finally:
        pipeline.finish(req, exchange, exchange.status, ok)


def _left(store: LocalQuotaStore) -> float:
    return store.counters("t", Limits(tokens_per_minute=TPM), 0.0).tokens.level


@pytest.mark.parametrize(
    ("answer", "stream", "left"),
    [
        (Answer(body=BODY), False, TPM - 40),  # the body's usage
        (Answer(chunks=STREAM), True, TPM - 40),  # the stream's usage chunk, though split
        (Answer(chunks=(b"data: {}\n\n", b"data: [DONE]\n\n")), True, TPM - 600),  # none: kept
        (Answer(status=400, body=b'{"error":{}}'), False, TPM),  # refused upstream: nothing
        (Answer(chunks=(b"data: {}\n\n",), break_with=ConnectionError), True, TPM - 600),
    ],
)
async def test_settled_from_the_answers_usage(answer: Answer, stream: bool, left: int) -> None:
    pipeline, _, store = _setup(FakeUpstream(default=answer))
    await _serve(pipeline, _req(stream))  # reserved 100 prompt + 500 max_tokens
    assert _left(store) == pytest.approx(left)
    assert store.in_flight("t") == 0


async def test_reservations_in_flight_refuse_the_next_and_settling_frees_them() -> None:
    pipeline, _, store = _setup(FakeUpstream(default=Answer(body=BODY)))
    first = await pipeline.open(_req(False), [], time.perf_counter())  # 600 reserved
    with pytest.raises(QuotaExceeded) as info:
        await pipeline.open(_req(False), [], time.perf_counter())
    assert info.value.retry_after_s == 12  # 200 missing at 1000 a minute
    pipeline.finish(_req(False), first, first.status, True)  # used 40: 960 left
    await _serve(pipeline, _req(False))
    assert _left(store) == pytest.approx(TPM - 80)


async def test_a_request_no_replica_served_is_refunded() -> None:
    pipeline, _, store = _setup(FakeUpstream(default=Answer(status=503)))
    with pytest.raises(GatewayError) as info:
        await _serve(pipeline, _req(False))
    assert info.value.status == 503
    assert _left(store) == pytest.approx(TPM) and store.in_flight("t") == 0
