"""Request-head limits and the connection cap, over real sockets with raw clients."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import orjson

from gateway.config import ServerConfig
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import MODEL, eventually, gateway_config
from tests.gateway.http.raw import connect

MAX_HEADER_BYTES = 4096
MAX_HEADERS = 20
HEADER_TIMEOUT_S = 0.5
MAX_CONNECTIONS = 8
WAIT_S = 5.0  # the longest any answer or close may take


@contextlib.asynccontextmanager
async def _gateway(fleet: SimFleet) -> AsyncIterator[RunningGateway]:
    server = ServerConfig(
        port=0,
        max_header_bytes=MAX_HEADER_BYTES,
        max_headers=MAX_HEADERS,
        header_timeout_s=HEADER_TIMEOUT_S,
        max_connections=MAX_CONNECTIONS,
    )
    async with running_gateway(gateway_config(fleet, server=server)) as gw:
        yield gw


def _head(path: str = "/v1/models", headers: list[tuple[str, str]] | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "host: gw"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes; fails if it keeps the connection open."""
    return await asyncio.wait_for(reader.read(), timeout=WAIT_S)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response's status and body (content-length framed), leaving the connection open."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=WAIT_S)
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), WAIT_S)
    return int(lines[0].split()[1]), body


def _refusal(raw: bytes, status: int, err_type: str) -> None:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), lines[0]
    assert "connection: close" in lines
    assert "content-type: application/json" in lines
    error = orjson.loads(body)["error"]
    assert (error["code"], error["type"]) == (status, err_type)


async def _models_ok(gw: RunningGateway, headers: list[tuple[str, str]] | None = None) -> None:
    async with connect(gw) as (reader, writer):
        writer.write(_head(headers=headers))
        status, body = await _response(reader)
        assert status == 200, body
        assert MODEL in body.decode()


async def test_an_oversized_head_gets_431_quickly_while_others_are_served(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, connect(gw) as (reader, writer):
        # A head just under the limit passes.
        await _models_ok(gw, [("x-pad", "a" * (MAX_HEADER_BYTES - 200))])
        started = time.monotonic()
        writer.write(_head()[:-2] + b"x-big: " + b"a" * (8 * 1024 * 1024))
        await _models_ok(gw)  # the loop is not stalled by the big head
        _refusal(await _read_to_eof(reader), 431, "RequestHeaderFieldsTooLargeError")
        assert time.monotonic() - started < 2.0


async def test_an_oversized_head_with_a_body_behind_it_is_refused(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, connect(gw) as (reader, writer):
        big = [("x-big", "a" * MAX_HEADER_BYTES)]
        writer.write(_head(headers=big)[:-2] + b"content-length: 10\r\n\r\n0123456789")
        _refusal(await _read_to_eof(reader), 431, "RequestHeaderFieldsTooLargeError")


async def test_too_many_headers_get_431(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw:
        # host plus MAX_HEADERS - 1 more: at the limit, served.
        await _models_ok(gw, [(f"x-h{i}", "v") for i in range(MAX_HEADERS - 1)])
        async with connect(gw) as (reader, writer):
            writer.write(_head(headers=[(f"x-h{i}", "v") for i in range(MAX_HEADERS)]))
            _refusal(await _read_to_eof(reader), 431, "RequestHeaderFieldsTooLargeError")


async def test_a_trickled_head_gets_408_at_the_deadline(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, connect(gw) as (reader, writer):
        started = time.monotonic()

        async def trickle() -> None:
            for byte in _head():
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)  # pacing the client, not synchronisation

        sender = asyncio.create_task(trickle())
        try:
            raw = await _read_to_eof(reader)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender
        _refusal(raw, 408, "RequestTimeoutError")
        assert HEADER_TIMEOUT_S <= time.monotonic() - started < HEADER_TIMEOUT_S + 2.0


async def test_the_deadline_runs_again_for_the_next_head_on_a_kept_alive_connection(
    fleet: SimFleet,
) -> None:
    async with _gateway(fleet) as gw, connect(gw) as (reader, writer):
        writer.write(_head())
        assert (await _response(reader))[0] == 200
        writer.write(b"GET /v1/mo")  # a head begun and never finished
        _refusal(await _read_to_eof(reader), 408, "RequestTimeoutError")


async def test_a_silent_connection_is_closed_at_the_deadline(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, connect(gw) as (reader, _):
        started = time.monotonic()
        assert await _read_to_eof(reader) == b""  # closed, no answer to a request never sent
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 2.0


async def test_the_connection_over_the_cap_is_refused_with_503(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(connect(gw)) for _ in range(MAX_CONNECTIONS - 1)]
        # Under the cap: a request on each held connection is served.
        for reader, writer in held:
            writer.write(_head())
            assert (await _response(reader))[0] == 200
        async with connect(gw) as (reader, writer):  # the cap-th connection
            writer.write(_head())
            assert (await _response(reader))[0] == 200
            async with connect(gw) as (over_reader, _):  # one past the cap
                _refusal(await _read_to_eof(over_reader), 503, "ServiceUnavailableError")
        # A slot freed: a new connection is served again.
        connections = gw.server.server_state.connections
        await eventually(lambda: len(connections) < MAX_CONNECTIONS, what="a freed slot")
        await _models_ok(gw)
