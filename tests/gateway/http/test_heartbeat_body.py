"""POST /admin/heartbeat reads its body as it arrives: a size limit and a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.config import ServerConfig
from gateway.http.app import GatewayApp
from simulator import SimFleet
from tests.gateway.conftest import InProcessGateway, gateway_config, in_process
from tests.gateway.http.errors import vllm_error

CHUNK = b" " * 65536
BEAT = {
    "replica": "sim-0",
    "gpu_memory_used_bytes": 3,
    "gpu_memory_total_bytes": 4,
    "gpu_utilization": 0.5,
}


async def test_an_endless_chunked_heartbeat_is_refused_at_the_limit(
    asgi_gateway: InProcessGateway,
) -> None:
    pulled = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(256):  # 16 MiB, no content-length
            pulled += 1
            yield CHUNK

    chunks = body()
    try:
        r = await asgi_gateway.client.post("/admin/heartbeat", content=chunks)
    finally:
        await chunks.aclose()
    vllm_error(r, 413)
    assert pulled <= 2  # the limit is 64 KiB: reading stopped at the chunk that passed it


async def test_a_heartbeat_sent_in_pieces_is_applied(asgi_gateway: InProcessGateway) -> None:
    raw = orjson.dumps(BEAT)

    async def body() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 7):
            yield raw[i : i + 7]

    r = await asgi_gateway.client.post("/admin/heartbeat", content=body())
    assert r.status_code == 204
    assert asgi_gateway.runtime.pool["sim-0"].gpu_util == 0.5


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    # From this host, as a sidecar agent posts: without admin keys only loopback may.
    return {
        "type": "http",
        "method": "POST",
        "path": "/admin/heartbeat",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
    }


async def _call(app: GatewayApp, scope: dict[str, Any], receive: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with asyncio.timeout(5):  # the old code waited for the body forever
        await app(scope, receive, send)
    return sent


async def test_a_declared_oversized_heartbeat_is_refused_unread(
    asgi_gateway: InProcessGateway,
) -> None:
    async def receive() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    scope = _scope([(b"content-length", b"1000000000")])
    sent = await _call(GatewayApp(asgi_gateway.runtime), scope, receive)
    assert sent[0]["status"] == 413
    assert orjson.loads(sent[1]["body"])["error"]["code"] == 413


async def test_a_heartbeat_that_never_arrives_times_out(fleet: SimFleet) -> None:
    cfg = gateway_config(fleet, server=ServerConfig(port=0, request_receive_timeout_s=0.2))
    async with in_process(cfg) as gw:
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": b'{"replica"', "more_body": True}
            await asyncio.Event().wait()  # the rest never comes
            raise AssertionError("unreachable")

        sent = await _call(GatewayApp(gw.runtime), _scope([]), receive)
        assert sent[0]["status"] == 408
        error = orjson.loads(sent[1]["body"])["error"]
        assert (error["code"], error["type"]) == (408, "RequestTimeoutError")
