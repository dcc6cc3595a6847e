"""The request path: the gateway's app in front of simulated vLLM replicas on real sockets."""

from __future__ import annotations

import httpx
import orjson
import pytest

from simulator import SimFleet
from tests.gateway.conftest import (
    LORA,
    MODEL,
    InProcessGateway,
    eventually,
    gateway_config,
    in_flight,
    in_process,
)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8}
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8}


def sse_events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n")
    frames = body[:-2].split(b"\n\n")
    assert all(f.startswith(b"data: ") for f in frames)
    return [f[6:] for f in frames]


@pytest.mark.parametrize(
    ("path", "payload"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)]
)
async def test_non_streamed(
    asgi_client: httpx.AsyncClient, asgi_gateway: InProcessGateway, path: str, payload: dict
) -> None:
    r = await asgi_client.post(path, json=payload)
    assert r.status_code == 200
    data = r.json()
    assert data["usage"]["completion_tokens"] == 8
    assert data["model"] == MODEL
    assert len(r.headers["x-request-id"]) == 32
    assert in_flight(asgi_gateway) == {"sim-0": 0, "sim-1": 0}


@pytest.mark.parametrize(
    ("path", "payload"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)]
)
async def test_streamed_relays_every_frame(
    client: httpx.AsyncClient, path: str, payload: dict
) -> None:
    # Over uvicorn: the frames are checked as they cross a real chunked HTTP response.
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([c async for c in r.aiter_raw()])
    events = sse_events(raw)
    assert events[-1] == b"[DONE]"
    usage = orjson.loads(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8


async def test_request_id_is_propagated(asgi_client: httpx.AsyncClient) -> None:
    r = await asgi_client.post(
        "/v1/chat/completions", json=CHAT, headers={"x-request-id": "abc-123"}
    )
    assert r.headers["x-request-id"] == "abc-123"


async def test_models_union_includes_lora(asgi_client: httpx.AsyncClient) -> None:
    r = await asgi_client.get("/v1/models")
    cards = {c["id"]: c for c in r.json()["data"]}
    assert set(cards) == {MODEL, LORA}
    assert cards[LORA]["parent"] == MODEL
    r = await asgi_client.post("/v1/chat/completions", json={**CHAT, "model": LORA})
    assert r.status_code == 200


async def test_health_and_ready(
    asgi_client: httpx.AsyncClient, fleet: SimFleet, asgi_gateway: InProcessGateway
) -> None:
    assert (await asgi_client.get("/health")).status_code == 200
    assert (await asgi_client.get("/ready")).status_code == 200
    for replica in fleet.replicas:
        await replica_faults(replica.url, unhealthy=True)
    await eventually(lambda: not asgi_gateway.runtime.pool.ready(), what="replicas marked down")
    r = await asgi_client.get("/ready")
    assert r.status_code == 503
    r = await asgi_client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "ServiceUnavailableError"
    assert "127.0.0.1" not in r.text
    for replica in fleet.replicas:
        await replica_faults(replica.url, unhealthy=False)
    await eventually(lambda: asgi_gateway.runtime.pool.ready(), what="replicas back up")
    assert (await asgi_client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def replica_faults(url: str, **faults: object) -> None:
    from tests.gateway.conftest import set_faults

    await set_faults(url, **faults)


@pytest.mark.parametrize(
    ("body", "status", "etype", "param"),
    [
        (b"{not json", 400, "BadRequestError", None),
        (b"[1, 2]", 400, "BadRequestError", None),
        (orjson.dumps({"messages": CHAT["messages"]}), 400, "BadRequestError", "model"),
        (orjson.dumps({**CHAT, "model": "nope"}), 404, "NotFoundError", "model"),
        (orjson.dumps({"model": MODEL, "messages": []}), 400, "BadRequestError", "messages"),
        (orjson.dumps({**CHAT, "stream": "yes"}), 400, "BadRequestError", "stream"),
    ],
)
async def test_validation_errors_in_vllm_shape(
    asgi_client: httpx.AsyncClient,
    asgi_gateway: InProcessGateway,
    body: bytes,
    status: int,
    etype: str,
    param: str | None,
) -> None:
    r = await asgi_client.post("/v1/chat/completions", content=body)
    assert r.status_code == status
    assert r.json() == {
        "error": {
            "message": r.json()["error"]["message"],
            "type": etype,
            "param": param,
            "code": status,
        }
    }
    assert in_flight(asgi_gateway) == {"sim-0": 0, "sim-1": 0}


async def test_upstream_validation_error_is_relayed(asgi_client: httpx.AsyncClient) -> None:
    r = await asgi_client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**7})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "BadRequestError"


async def test_wrong_method_and_path(asgi_client: httpx.AsyncClient) -> None:
    r = await asgi_client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
    r = await asgi_client.post("/v1/images/generations", json={})
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    # Replica-only routes are not forwarded: the gateway proxies an allowlist.
    assert (await asgi_client.post("/reset_prefix_cache", json={})).status_code == 404


async def test_body_limit_is_413_before_parsing(fleet: SimFleet) -> None:
    from gateway.config import ServerConfig

    cfg = gateway_config(fleet, server=ServerConfig(port=0, max_body_bytes=1000))
    async with in_process(cfg) as gw:
        c = gw.client
        r = await c.post("/v1/completions", content=b"{" + b" " * 2000)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == 413

        async def chunked():  # no content-length: the limit applies while reading
            for _ in range(5):
                yield b" " * 400

        r = await c.post("/v1/completions", content=chunked())
        assert r.status_code == 413


async def test_api_keys(fleet: SimFleet) -> None:
    from gateway.config import ServerConfig

    cfg = gateway_config(fleet, server=ServerConfig(port=0, api_keys=("k1", "k2")))
    async with in_process(cfg) as gw:
        c = gw.client
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer k3"})
        assert r.status_code == 401
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer k2"})
        assert r.status_code == 200


async def test_metrics_exposition(asgi_client: httpx.AsyncClient) -> None:
    await asgi_client.post("/v1/chat/completions", json=CHAT)
    async with asgi_client.stream(
        "POST", "/v1/chat/completions", json={**CHAT, "stream": True}
    ) as r:
        await r.aread()
    text = (await asgi_client.get("/metrics")).text
    assert f'model="{MODEL}"' in text
    assert "llm_gateway_requests_total{" in text and 'status="200"' in text and "branch=" in text
    assert "llm_gateway_request_duration_seconds_bucket" in text
    assert "llm_gateway_time_to_first_token_seconds_count" in text
    assert 'llm_gateway_in_flight_requests{replica="sim-0"} 0.0' in text


async def test_a_malformed_priority_header_is_refused_before_routing(
    asgi_client: httpx.AsyncClient, asgi_gateway: InProcessGateway
) -> None:
    r = await asgi_client.post("/v1/chat/completions", json=CHAT, headers={"x-priority": "urgent"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and "`x-priority` header" in err["message"]
    assert sum(rep.requests_total for rep in asgi_gateway.runtime.pool) == 0
    ok = await asgi_client.post("/v1/chat/completions", json=CHAT, headers={"x-priority": "-3"})
    assert ok.status_code == 200
