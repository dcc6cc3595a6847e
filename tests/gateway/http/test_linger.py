"""Lingering close: an answer sent before the body was read is readable, and bounded."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import orjson
import pytest

from gateway.config import ServerConfig
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import MODEL, gateway_config

LINGER_S = 0.5
SMALL_LIMIT = 1024
WAIT_S = 5.0


@contextlib.asynccontextmanager
async def _gateway(fleet: SimFleet, **server: object) -> AsyncIterator[RunningGateway]:
    cfg = gateway_config(fleet, server=ServerConfig(port=0, **server))  # type: ignore[arg-type]
    async with running_gateway(cfg) as gw:
        yield gw


def _post_whole(url: str, body: bytes) -> tuple[int, bytes]:
    """urllib's POST: the body in one go, `Connection: close`, the answer read after it."""
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def test_a_64_mib_body_sent_whole_reads_the_413(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw:
        body = b"x" * (64 * 1024 * 1024)
        for _ in range(2):  # and the gateway serves on
            status, answer = await asyncio.to_thread(_post_whole, gw.url, body)
            assert status == 413
            assert orjson.loads(answer)["error"]["type"] == "RequestEntityTooLargeError"


def _open(gw: RunningGateway, head: bytes) -> socket.socket:
    url = urlsplit(gw.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=WAIT_S)
    sock.sendall(head)
    return sock


def _big_post(connection: str) -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        f"content-length: 1000000000\r\n{connection}\r\n"
    ).encode()


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"}}" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def _trickle_until_closed(sock: socket.socket) -> float:
    """Send 1 kB every 20 ms until the server closes; the seconds that took."""
    started = time.monotonic()
    while time.monotonic() - started < WAIT_S:
        try:
            sock.sendall(b"x" * 1024)
        except OSError:
            return time.monotonic() - started
        time.sleep(0.02)  # the client's pace, not synchronisation
    raise AssertionError("the server kept reading a refused body")


@pytest.mark.parametrize("connection", ["", "connection: close\r\n"])
async def test_a_refused_body_is_dropped_for_linger_timeout_s_at_most(
    fleet: SimFleet, connection: str
) -> None:
    async with _gateway(fleet, max_body_bytes=SMALL_LIMIT, linger_timeout_s=LINGER_S) as gw:
        sock = _open(gw, _big_post(connection))
        try:
            answer = await asyncio.to_thread(_read_answer, sock)
            assert answer.startswith(b"HTTP/1.1 413 ")
            took = await asyncio.to_thread(_trickle_until_closed, sock)
            assert took >= LINGER_S / 2  # not closed at once: it lingered
        finally:
            sock.close()


def _blast(sock: socket.socket, size: int) -> bool:
    """Whether the server closed before `size` bytes went out."""
    try:
        sock.sendall(b"x" * size)
        return sock.recv(1) == b""
    except TimeoutError:
        return False  # still open: it neither read on nor closed
    except OSError:
        return True


async def test_a_refused_body_is_dropped_for_linger_max_bytes_at_most(fleet: SimFleet) -> None:
    async with _gateway(fleet, max_body_bytes=SMALL_LIMIT, linger_max_bytes=65536) as gw:
        sock = _open(gw, _big_post(""))
        try:
            assert (await asyncio.to_thread(_read_answer, sock)).startswith(b"HTTP/1.1 413 ")
            assert await asyncio.to_thread(_blast, sock, 32 * 1024 * 1024)
        finally:
            sock.close()


def _two_requests(url: str) -> tuple[int, int]:
    """On one kept-alive connection: a body over the limit, then an ordinary request."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S)
    try:
        conn.request("POST", "/v1/chat/completions", body=b"x" * (1024 * 1024))
        first = conn.getresponse()
        first.read()
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        conn.request("POST", "/v1/chat/completions", body=orjson.dumps(chat))
        second = conn.getresponse()
        second.read()
        return first.status, second.status
    finally:
        conn.close()


async def test_a_kept_alive_connection_serves_on_once_the_refused_body_is_read(
    fleet: SimFleet,
) -> None:
    async with _gateway(fleet, max_body_bytes=SMALL_LIMIT) as gw:
        assert await asyncio.to_thread(_two_requests, gw.url) == (413, 200)
