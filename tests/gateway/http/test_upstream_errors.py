"""Upstream 4xx answers: vLLM's JSON relayed as it is, anything else mapped to its shape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.config import GatewayConfig, ReplicaConfig, ServerConfig
from tests.gateway.aiohttp_upstream import replica_app, serve
from tests.gateway.conftest import InProcessGateway, in_process
from tests.gateway.http.errors import vllm_error

VLLM_ERROR = orjson.dumps(
    {
        "error": {
            "message": "max_tokens must be at least 1, got 0.",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
)
VLLM_FLAT_ERROR = orjson.dumps(
    {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}
)
NGINX_413 = b"<html><head><title>413 Request Entity Too Large</title></head><body>nginx</body>"
# What the replica answers next: status, content type, body.
Answer = tuple[int, str, bytes]


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[InProcessGateway, list[Answer]]]:
    answers: list[Answer] = []

    async def chat(_: web.Request) -> web.Response:
        status, content_type, body = answers[-1]
        return web.Response(status=status, body=body, headers={"content-type": content_type})

    async with serve(replica_app(chat)) as url:
        cfg = GatewayConfig(
            server=ServerConfig(port=0),
            replicas=(ReplicaConfig(url=url, name="up", models=("m",)),),
        )
        async with in_process(cfg) as gw:
            yield gw, answers


async def _chat(gw: InProcessGateway, stream: bool = False) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return await gw.client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_plain_text_4xx_is_mapped_with_a_bounded_quote(
    gateway: tuple[InProcessGateway, list[Answer]], stream: bool
) -> None:
    gw, answers = gateway
    text = b"Got more than 8190 bytes (9000) when reading Header value is too long."
    answers.append((400, "text/plain; charset=utf-8", text))
    r = await _chat(gw, stream)
    error = vllm_error(r, 400)
    assert error["type"] == "BadRequestError"
    assert "Got more than 8190 bytes" in error["message"]
    # A long body is quoted in part only.
    answers.append((429, "text/plain", b"slow down " * 2000))
    r = await _chat(gw, stream)
    error = vllm_error(r, 429)
    assert error["type"] == "RateLimitError" and len(error["message"]) < 300


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [
        (413, "text/html", NGINX_413),
        (404, "application/json", b'{"detail":"Not Found"}'),
        (400, "application/json", b"{not json"),
        (403, "", b"\x00\xff binary"),
    ],
)
async def test_other_4xx_bodies_are_mapped_without_their_bytes(
    gateway: tuple[InProcessGateway, list[Answer]], status: int, content_type: str, body: bytes
) -> None:
    gw, answers = gateway
    answers.append((status, content_type, body))
    r = await _chat(gw)
    vllm_error(r, status)
    for piece in (b"nginx", b"<html", b"detail", b"not json", b"binary"):
        assert piece not in r.content


@pytest.mark.parametrize("body", [VLLM_ERROR, VLLM_FLAT_ERROR])
async def test_vllm_json_errors_are_relayed_unchanged(
    gateway: tuple[InProcessGateway, list[Answer]], body: bytes
) -> None:
    gw, answers = gateway
    answers.append((400, "application/json", body))
    r = await _chat(gw)
    assert r.status_code == 400
    assert r.content == body
