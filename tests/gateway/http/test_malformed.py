"""Requests the HTTP parser rejects, and paths near the routes, answered in vLLM's shape."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import orjson
import pytest

from gateway.process import RunningGateway
from tests.gateway.conftest import MODEL

WAIT_S = 5.0
CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


@contextlib.asynccontextmanager
async def _exchange(gw: RunningGateway, raw: bytes) -> AsyncIterator[bytes]:
    """Send `raw`, yield what the server answers before it closes (or the first answer)."""
    url = urlsplit(gw.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(raw)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        fields = dict(
            line.lower().split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if line
        )
        body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), WAIT_S)
        yield head + body
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _json_error(raw: bytes, status: int) -> dict[str, object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), lines[0]
    assert "content-type: application/json" in lines
    assert not any(line.startswith("location:") for line in lines)
    error: dict[str, object] = orjson.loads(body)["error"]
    assert error["code"] == status
    return error


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /health HTTP/9.9\r\nhost: gw\r\n\r\n",
        b"GET /health HTTP/1.1\r\nhost: gw\r\nbad header\r\n\r\n",
        b"GET /he\x00alth HTTP/1.1\r\nhost: gw\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_what_the_parser_rejects_gets_a_json_400(gateway: RunningGateway, raw: bytes) -> None:
    async with _exchange(gateway, raw) as answer:
        error = _json_error(answer, 400)
        assert error["type"] == "BadRequestError"
        assert b"connection: close" in answer


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/", "/v1/models/"])
async def test_a_trailing_slash_is_a_404_not_a_redirect(gateway: RunningGateway, path: str) -> None:
    method = "GET" if path == "/v1/models/" else "POST"
    raw = (
        f"{method} {path} HTTP/1.1\r\nhost: evil.example\r\ncontent-type: application/json\r\n"
        f"content-length: {len(CHAT)}\r\n\r\n"
    ).encode() + CHAT
    async with _exchange(gateway, raw) as answer:
        assert _json_error(answer, 404)["type"] == "NotFoundError"
        assert b"evil.example" not in answer


async def test_a_websocket_upgrade_off_v1_realtime_is_refused_as_vllm_does(
    gateway: RunningGateway,
) -> None:
    # Only /v1/realtime takes a socket (test_realtime.py); elsewhere uvicorn's bare 403.
    raw = (
        b"GET /health HTTP/1.1\r\nhost: gw\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
        b"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    async with _exchange(gateway, raw) as answer:
        assert answer.startswith(b"HTTP/1.1 403 "), answer


async def test_another_upgrade_is_served_as_plain_http(gateway: RunningGateway) -> None:
    raw = b"GET /health HTTP/1.1\r\nhost: gw\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
    async with _exchange(gateway, raw) as answer:
        assert answer.startswith(b"HTTP/1.1 200 "), answer
