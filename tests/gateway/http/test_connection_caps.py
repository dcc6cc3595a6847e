"""Connections per client address, and the idle keep-alive timeout, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.config import ServerConfig
from gateway.http import protocol
from gateway.http.protocol import GuardedHttpToolsProtocol
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import eventually, gateway_config
from tests.gateway.http.raw import Conn, connect

PER_CLIENT = 3
KEEPALIVE_S = 0.3
WAIT_S = 5.0
HEAD = b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n"


@contextlib.asynccontextmanager
async def _gateway(fleet: SimFleet, **server_kw: object) -> AsyncIterator[RunningGateway]:
    server = ServerConfig(
        port=0,
        max_connections_per_client=PER_CLIENT,
        keepalive_timeout_s=KEEPALIVE_S,
        **server_kw,  # type: ignore[arg-type]
    )
    async with running_gateway(gateway_config(fleet, server=server)) as gw:
        yield gw


async def _served(conn: Conn) -> None:
    reader, writer = conn
    writer.write(HEAD)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    assert head.startswith(b"HTTP/1.1 200 "), head


@pytest.fixture
def loopback_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loopback is never capped (a local proxy multiplexes clients); every client of these
    # tests is on loopback, so for them it counts like any address.
    monkeypatch.setattr(protocol, "LOOPBACK", ())


@pytest.mark.usefixtures("loopback_capped")
async def test_connections_over_the_per_client_cap_get_503(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(connect(gw)) for _ in range(PER_CLIENT)]
        for conn in held:
            await _served(conn)
        async with connect(gw) as (reader, _):  # one past this address's cap
            raw = await asyncio.wait_for(reader.read(), WAIT_S)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head
        error = orjson.loads(body)["error"]
        assert (error["code"], error["type"]) == (503, "ServiceUnavailableError")
        # Another address is not held to this one's count.
        async with connect(gw, source="127.0.0.2") as other:
            await _served(other)
        # A connection of this address closes: its slot is free again.
        reader, writer = held.pop()
        writer.close()
        served_by = next(iter(gw.server.server_state.connections))
        assert isinstance(served_by, GuardedHttpToolsProtocol)
        per_client = served_by.per_client
        await eventually(lambda: per_client.get("127.0.0.1") == PER_CLIENT - 1, what="freed")
        async with connect(gw) as again:
            await _served(again)


async def _all_served(gw: RunningGateway, source: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(PER_CLIENT + 2):
            await _served(await stack.enter_async_context(connect(gw, source)))


async def test_loopback_is_not_capped(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw:
        await _all_served(gw, "127.0.0.1")


@pytest.mark.usefixtures("loopback_capped")
async def test_trusted_proxies_are_not_capped(fleet: SimFleet) -> None:
    async with _gateway(fleet, trusted_proxies=("127.0.0.2/32",)) as gw:
        await _all_served(gw, "127.0.0.2")


async def test_an_idle_kept_alive_connection_is_closed(fleet: SimFleet) -> None:
    async with _gateway(fleet) as gw, connect(gw) as (reader, writer):
        writer.write(HEAD)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # EOF: closed by the server
        assert KEEPALIVE_S * 0.8 <= time.monotonic() - started < KEEPALIVE_S + 2.0
