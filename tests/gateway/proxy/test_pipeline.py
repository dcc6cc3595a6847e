"""The pipeline over a scripted Upstream: routing, retries, leases and error mapping, no sockets."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from gateway.config import (
    GatewayConfig,
    HealthCheckConfig,
    RoutingConfig,
    UpstreamConfig,
)
from gateway.errors import GatewayError, UpstreamFailed, UpstreamTimeout
from gateway.proxy.requests import ParsedRequest, parse_request
from gateway.proxy.upstream import Exchange, StreamBroken
from tests.gateway.fake_upstream import (
    Answer,
    FakeClientError,
    FakeUpstream,
    PipelineRig,
    pipeline_rig,
    replica_configs,
)

MODEL = "m"
# Long enough to cost prefill: the pipeline counts it on the replica until the first byte.
PROMPT = "word " * 80
# Short deadlines: a hanging replica costs the test this long, not the production default.
FAST = 0.05


def rig(
    upstream: FakeUpstream,
    replicas: int = 2,
    threshold: int = 100,
    **upstream_cfg: float,
) -> PipelineRig:
    """A pipeline over `replicas` healthy replicas r0, r1, ... served by `upstream`."""
    cfg = GatewayConfig(
        upstream=UpstreamConfig(**upstream_cfg),  # type: ignore[arg-type]
        health_check=HealthCheckConfig(passive_failure_threshold=threshold),
        # Every replica in turn, whatever the cache would prefer: retries are what's tested.
        routing=RoutingConfig(profile="round_robin"),
        replicas=replica_configs(replicas, MODEL),
    )
    return pipeline_rig(upstream, cfg)


def chat(stream: bool = False) -> ParsedRequest:
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}
    return parse_request("chat", orjson.dumps(body), "rid-1")


async def serve(r: PipelineRig, req: ParsedRequest) -> tuple[Exchange, bytes, bool]:
    """What a front end does: open, relay every chunk, finish once; (exchange, body, ok)."""
    exchange = await r.pipeline.open(req, [], time.perf_counter())
    body, ok = bytearray(), True
    try:
        async for chunk in exchange.chunks():
            body += chunk
    except StreamBroken:
        ok = False
    finally:
        r.pipeline.finish(req, exchange, exchange.status, ok and exchange.status < 500)
    return exchange, bytes(body), ok


async def refused(r: PipelineRig, req: ParsedRequest) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await serve(r, req)
    return info.value


# --- success ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_is_relayed_and_its_connection_reused(stream: bool) -> None:
    r = rig(FakeUpstream())
    req = chat(stream)
    exchange, body, ok = await serve(r, req)
    assert ok and exchange.status == 200 and exchange.streaming is stream
    assert body == (b"data: 1\n\ndata: [DONE]\n\n" if stream else b'{"ok":true}')
    (sent,) = r.upstream.sent
    assert sent.url == f"http://{sent.replica}:8000/v1/chat/completions"
    # Forwarded as received: the very bytes object, not a copy.
    assert sent.body is req.body and sent.headers["x-request-id"] == "rid-1"
    (response,) = r.upstream.responses
    assert response.released and not response.closed
    assert r.idle() and r.pool[sent.replica].requests_total == 1


async def test_a_4xx_is_relayed_not_retried() -> None:
    error = b'{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}'
    r = rig(FakeUpstream(default=Answer(status=400, body=error)))
    exchange, body, ok = await serve(r, chat(stream=True))
    assert exchange.status == 400 and not exchange.streaming and body == error and ok
    assert len(r.upstream.sent) == 1
    assert all(rep.errors_total == 0 and rep.passive_failures == 0 for rep in r.pool)
    assert r.idle()


# --- retries ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_5xx_before_the_first_byte_is_retried_on_another_replica(stream: bool) -> None:
    r = rig(FakeUpstream(sequence=[Answer(status=503), Answer()]))
    exchange, _, ok = await serve(r, chat(stream))
    first, second = r.upstream.calls
    assert first != second and exchange.lease.replica.name == second
    assert ok and exchange.status == 200
    assert r.retries(first, "status_503") == 1.0
    # The failed answer's connection is cut, the good one goes back to the pool.
    failed, served = r.upstream.responses
    assert failed.closed and not failed.released and served.released
    assert r.pool[first].errors_total == 1 and r.pool[first].passive_failures == 1
    assert r.pool[second].errors_total == 0
    assert r.idle()


async def test_never_the_same_replica_twice() -> None:
    r = rig(FakeUpstream(default=Answer(status=500)), replicas=3, max_retries=5)
    err = await refused(r, chat())
    # Three replicas, three attempts, though five retries are allowed.
    assert sorted(r.upstream.calls) == ["r0", "r1", "r2"]
    assert isinstance(err, UpstreamFailed) and err.status == 502
    assert [rep.errors_total for rep in r.pool] == [1, 1, 1]
    assert r.idle()


@pytest.mark.parametrize("max_retries", [0, 1, 2])
async def test_max_retries_is_honoured(max_retries: int) -> None:
    r = rig(FakeUpstream(default=Answer(status=503)), replicas=4, max_retries=max_retries)
    err = await refused(r, chat())
    assert len(set(r.upstream.calls)) == len(r.upstream.calls) == 1 + max_retries
    assert err.status == 503
    assert r.idle()


@pytest.mark.parametrize(
    ("answers", "error", "status", "message"),
    [
        ([Answer(status=503), Answer(hang="headers")], UpstreamTimeout, 504, "in time"),
        ([Answer(hang="headers"), Answer(status=503)], UpstreamFailed, 503, "HTTP 503"),
        ([Answer(refuse=ConnectionRefusedError), Answer(status=500)], UpstreamFailed, 502, "500"),
        ([Answer(status=500), Answer(refuse=ConnectionRefusedError)], UpstreamFailed, 502, "reach"),
    ],
)
async def test_the_last_error_is_what_the_client_gets(
    answers: list[Answer], error: type[GatewayError], status: int, message: str
) -> None:
    upstream = FakeUpstream(sequence=answers)
    r = rig(upstream, replicas=3, max_retries=1, non_stream_timeout_s=FAST)
    err = await refused(r, chat())
    assert type(err) is error and err.status == status and message in err.message
    assert len(r.upstream.calls) == 2
    assert r.idle()


# --- the error mapping table ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "stream", "status", "error", "reason"),
    [
        (Answer(status=500), False, 502, UpstreamFailed, "status_500"),
        (Answer(status=501), True, 502, UpstreamFailed, "status_501"),
        (Answer(status=502), False, 502, UpstreamFailed, "status_502"),
        (Answer(status=503), True, 503, UpstreamFailed, "status_503"),
        (Answer(status=504), False, 504, UpstreamFailed, "status_504"),
        (
            Answer(refuse=ConnectionRefusedError),
            False,
            502,
            UpstreamFailed,
            "ConnectionRefusedError",
        ),
        (Answer(refuse=ConnectionResetError), True, 502, UpstreamFailed, "ConnectionResetError"),
        # A declared transport error that is no ConnectionError (aiohttp's are not).
        (Answer(refuse=FakeClientError), False, 502, UpstreamFailed, "FakeClientError"),
        (Answer(hang="headers"), False, 504, UpstreamTimeout, "timeout"),
        (Answer(hang="headers"), True, 504, UpstreamTimeout, "timeout"),
        (Answer(hang="first_byte"), False, 504, UpstreamTimeout, "timeout"),
        (Answer(hang="first_byte"), True, 504, UpstreamTimeout, "timeout"),
        (Answer(chunks=()), True, 502, UpstreamFailed, "empty_stream"),
    ],
)
async def test_failures_before_the_first_byte_map_to_a_status_and_a_retry_reason(
    answer: Answer, stream: bool, status: int, error: type[GatewayError], reason: str
) -> None:
    r = rig(
        FakeUpstream(default=answer),
        max_retries=1,
        first_byte_timeout_s=FAST,
        non_stream_timeout_s=FAST,
    )
    err = await refused(r, chat(stream))
    assert type(err) is error and err.status == status
    # Client-safe: nothing names a replica.
    assert "r0" not in err.message and "r1" not in err.message and "8000" not in err.message
    assert [r.retries(name, reason) for name in r.upstream.calls] == [1.0, 1.0]
    assert all(resp.closed and not resp.released for resp in r.upstream.responses)
    assert r.idle() and all(rep.errors_total == 1 for rep in r.pool)


async def test_only_the_start_of_a_failing_replicas_body_is_read() -> None:
    r = rig(FakeUpstream(sequence=[Answer(status=500, body=b"x" * 10_000), Answer()]))
    await serve(r, chat())
    assert r.upstream.responses[0].read_limits == [512]


def test_an_unknown_error_is_not_a_transport_error() -> None:
    # The seam declares its transport errors; anything else is a bug and must surface.
    assert not issubclass(ValueError, FakeUpstream().transport_errors)


async def test_an_undeclared_error_is_not_retried_and_frees_the_lease() -> None:
    r = rig(FakeUpstream(sequence=[Answer(refuse=ValueError)]))
    with pytest.raises(ValueError):
        await serve(r, chat())
    assert len(r.upstream.calls) == 1
    # Not counted against the replica: the gateway, not the replica, is at fault.
    assert r.idle() and all(rep.errors_total == 0 for rep in r.pool)


# --- first-byte budgets ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("hang", ["headers", "first_byte"])
async def test_each_kind_of_request_has_its_own_first_byte_budget(stream: bool, hang: str) -> None:
    # The other kind's budget is 100 times longer: the deadline that fired is the right one.
    other = 100 * FAST
    budgets = {"first_byte_timeout_s": FAST, "non_stream_timeout_s": other}
    if not stream:
        budgets = {"first_byte_timeout_s": other, "non_stream_timeout_s": FAST}
    r = rig(FakeUpstream(default=Answer(hang=hang)), max_retries=0, **budgets)  # type: ignore[arg-type]
    started = time.monotonic()
    err = await refused(r, chat(stream))
    assert isinstance(err, UpstreamTimeout)
    assert time.monotonic() - started < other / 2
    assert r.idle()


async def test_a_stream_without_a_response_head_is_retried_after_the_head_timeout() -> None:
    r = rig(
        FakeUpstream(by_replica={"r0": Answer(hang="headers")}),
        response_head_timeout_s=FAST,
        first_byte_timeout_s=100 * FAST,
    )
    started = time.monotonic()
    exchange, body, ok = await serve(r, chat(stream=True))
    assert time.monotonic() - started < 50 * FAST
    assert ok and exchange.lease.replica.name == "r1" and body.endswith(b"[DONE]\n\n")
    assert r.upstream.calls == ["r0", "r1"] and r.retries("r0", "head_timeout") == 1.0
    assert r.idle()


async def test_a_stream_whose_head_came_waits_for_its_first_chunk_under_the_total() -> None:
    # The head deadline ends with the head: the first chunk has first_byte_timeout_s.
    r = rig(
        FakeUpstream(default=Answer(hang="first_byte")),
        response_head_timeout_s=FAST,
        first_byte_timeout_s=10 * FAST,
        max_retries=0,
    )
    started = time.monotonic()
    assert isinstance(await refused(r, chat(stream=True)), UpstreamTimeout)
    assert time.monotonic() - started >= 10 * FAST
    assert r.retries(r.upstream.calls[0], "timeout") == 1.0


async def test_a_non_streamed_answer_is_not_held_to_the_head_timeout() -> None:
    # vLLM sends a non-streamed answer's head with its body, after the whole generation.
    r = rig(
        FakeUpstream(default=Answer(hang="headers")),
        response_head_timeout_s=FAST,
        non_stream_timeout_s=10 * FAST,
        max_retries=0,
    )
    started = time.monotonic()
    assert isinstance(await refused(r, chat()), UpstreamTimeout)
    assert time.monotonic() - started >= 10 * FAST
    assert r.retries(r.upstream.calls[0], "timeout") == 1.0


@pytest.mark.parametrize("stream", [False, True])
async def test_attempts_waiting_on_a_replica_health_checks_mark_down_are_retried(
    stream: bool,
) -> None:
    r = rig(FakeUpstream(by_replica={"r0": Answer(hang="headers")}), non_stream_timeout_s=100.0)
    task = asyncio.create_task(serve(r, chat(stream)))
    await asyncio.wait_for(r.upstream.waiting.wait(), timeout=5.0)
    r.pool.probe_failed(r.pool["r0"], "TimeoutError")
    exchange, _, ok = await asyncio.wait_for(task, timeout=5.0)
    assert ok and exchange.lease.replica.name == "r1"
    assert r.retries("r0", "replica_down") == 1.0 and not r.pool["r0"].awaiting
    assert r.idle()


async def test_a_gap_after_the_first_chunk_is_the_idle_timeouts_not_a_retry() -> None:
    # The first chunk came in time: a stall after it breaks the stream (the client has bytes
    # already) after idle_timeout_s, however long the first-byte budget is.
    answer = Answer(chunks=(b"data: 1\n\n",), hang="after_chunks")
    r = rig(FakeUpstream(default=answer), first_byte_timeout_s=100 * FAST, idle_timeout_s=FAST)
    started = time.monotonic()
    exchange, body, ok = await serve(r, chat(stream=True))
    assert time.monotonic() - started < 50 * FAST
    assert exchange.status == 200 and body == b"data: 1\n\n" and not ok
    assert len(r.upstream.calls) == 1 and r.idle()


# --- after the first byte -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Answer(break_with=ConnectionResetError), "ConnectionResetError"),
        (Answer(break_with=FakeClientError), "FakeClientError"),
        (Answer(hang="after_chunks"), "idle_timeout"),
    ],
)
async def test_a_stream_broken_after_its_first_byte_is_not_retried(
    answer: Answer, reason: str
) -> None:
    r = rig(FakeUpstream(default=answer), idle_timeout_s=FAST)
    req = chat(stream=True)
    exchange = await r.pipeline.open(req, [], time.perf_counter())
    received = []
    with pytest.raises(StreamBroken) as info:
        async for chunk in exchange.chunks():
            received.append(chunk)
    assert info.value.reason == reason
    assert received == [b"data: 1\n\n", b"data: [DONE]\n\n"]
    r.pipeline.finish(req, exchange, exchange.status, False)
    (name,) = r.upstream.calls
    (response,) = r.upstream.responses
    # Cut, not pooled: the connection's state is unknown.
    assert response.closed and not response.released
    assert r.pool[name].errors_total == 1 and r.idle()


# --- leases on every path -------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers",
    [
        [Answer(hang="headers")],
        [Answer(hang="first_byte")],
        [Answer(status=503), Answer(hang="headers")],
    ],
    ids=["before-headers", "before-first-byte", "during-the-retry"],
)
async def test_a_request_cancelled_mid_attempt_frees_its_lease(answers: list[Answer]) -> None:
    r = rig(FakeUpstream(sequence=answers), replicas=3)
    task = asyncio.create_task(r.pipeline.open(chat(stream=True), [], time.perf_counter()))
    await asyncio.wait_for(r.upstream.waiting.wait(), timeout=5.0)
    stuck = r.upstream.calls[-1]
    assert r.in_flight()[stuck] == 1 and r.pool[stuck].queued_prefill_tokens > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert r.idle()
    # The client left: not the replica's fault.
    assert r.pool[stuck].errors_total == 0 and r.pool[stuck].requests_total == 1
    assert all(resp.closed for resp in r.upstream.responses)
    assert sum(rep.errors_total for rep in r.pool) == len(answers) - 1


async def test_a_stream_cancelled_mid_relay_cuts_the_upstream_and_frees_its_lease() -> None:
    r = rig(FakeUpstream(default=Answer(chunks=(b"data: 1\n\n",), hang="after_chunks")))
    req = chat(stream=True)
    exchange = await r.pipeline.open(req, [], time.perf_counter())

    async def relay() -> None:
        try:
            async for _ in exchange.chunks():
                pass
        finally:
            r.pipeline.finish(req, exchange, exchange.status, True)

    task = asyncio.create_task(relay())
    await asyncio.wait_for(r.upstream.waiting.wait(), timeout=5.0)
    assert sum(r.in_flight().values()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (response,) = r.upstream.responses
    assert response.closed and not response.released
    assert r.idle() and all(rep.errors_total == 0 for rep in r.pool)


# --- passive health -------------------------------------------------------------------------


async def test_passive_failures_mark_a_replica_down() -> None:
    r = rig(FakeUpstream(by_replica={"r0": Answer(status=500)}), threshold=2)
    for _ in range(6):
        exchange, _, ok = await serve(r, chat())
        assert ok and exchange.status == 200 and exchange.lease.replica.name == "r1"
    r0 = r.pool["r0"]
    # Down after its second failure, and routed around from then on.
    assert not r0.healthy and r0.errors_total == 2 and r.upstream.calls.count("r0") == 2
    assert r.pool["r1"].healthy and r.idle()


async def test_an_out_of_memory_error_body_ejects_the_replica_at_once() -> None:
    oom = b'{"error":{"message":"CUDA out of memory. Tried to allocate 20.00 MiB"}}'
    r = rig(FakeUpstream(by_replica={"r0": Answer(status=500, body=oom)}), threshold=100)
    exchange, _, ok = await serve(r, chat())
    assert ok and exchange.lease.replica.name == "r1"
    assert r.pool.outlier.ejected("r0") and r.pool.ejections["r0"] == {"out_of_memory": 1}
    for _ in range(4):
        assert (await serve(r, chat()))[0].lease.replica.name == "r1"
    assert r.upstream.calls.count("r0") == 1 and r.idle()


async def test_a_success_resets_the_passive_failure_count() -> None:
    script = [Answer(status=500), Answer(), Answer(status=500)]
    r = rig(FakeUpstream(by_replica={"r0": script}), threshold=2)
    for _ in range(20):
        if r.upstream.calls.count("r0") == 3:
            break
        await serve(r, chat())
    assert r.upstream.calls.count("r0") == 3
    r0 = r.pool["r0"]
    assert r0.healthy and r0.errors_total == 2 and r0.passive_failures == 1
    assert r.idle()
