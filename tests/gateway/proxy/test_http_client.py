"""The hot path's HTTP/1.1 client against scripted replicas on real 127.0.0.1 sockets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.config import UpstreamConfig
from gateway.proxy.http_client import (
    Http1Client,
    Http1Upstream,
    PoolTimeout,
    UpstreamClosed,
    UpstreamProtocolError,
    _Connection,
)

WAIT_S = 5.0
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (content-length bodies only, as the client sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class Replica:
    """A scripted replica: `handler(reader, writer, connection_index)` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            await self.handler(reader, writer, index)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


@contextlib.asynccontextmanager
async def replica(handler: Handler) -> AsyncIterator[tuple[Replica, str]]:
    r = Replica(handler)
    server = await asyncio.start_server(r._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield r, f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()


def keep_alive(answer: bytes = OK, record: list[bytes] | None = None) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        while True:
            head, body = await read_request(reader)
            if record is not None:
                record.append(head + body)
            writer.write(answer)
            await writer.drain()

    return handler


async def until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)  # polling a condition under a deadline


def client(**kw: float) -> Http1Client:
    return Http1Client(UpstreamConfig(**kw))  # type: ignore[arg-type]


async def test_posts_the_body_with_its_headers_and_reuses_the_connection() -> None:
    seen: list[bytes] = []
    async with replica(keep_alive(record=seen)) as (rep, url):
        c = client()
        for _ in range(3):
            resp = await c.post(url, b'{"a":1}', {"content-type": "application/json", "x-r": "1"})
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "application/json"
            assert ("content-length", "2") in resp.headers.items()
            assert await resp.read() == b"{}"
            resp.release()
        await c.close()
    assert rep.connections == 1
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert {b"content-length: 7", b"content-type: application/json", b"x-r: 1"} <= set(lines)
    assert any(line.startswith(b"host: 127.0.0.1:") for line in lines)
    assert body == b'{"a":1}'


async def test_a_chunked_stream_arrives_chunk_by_chunk() -> None:
    second = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata 1\r\n")
        await second.wait()
        writer.write(b"6\r\ndata 2\r\n0\r\n\r\n")
        await read_request(reader)  # the connection stays usable

    async with replica(handler) as (rep, url):
        c = client()
        resp = await c.post(url, b"{}", {})
        assert await asyncio.wait_for(resp.content.readany(), WAIT_S) == b"data 1"
        second.set()
        assert await asyncio.wait_for(resp.content.readany(), WAIT_S) == b"data 2"
        assert await resp.content.readany() == b""
        resp.release()
        await c.close()
    assert rep.connections == 1


async def test_a_body_delimited_by_the_close_is_read_whole_and_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async with replica(handler) as (rep, url):
        c = client()
        for _ in range(2):
            resp = await c.post(url, b"{}", {})
            assert await resp.read() == b"all of it"
            resp.release()
        await c.close()
    assert rep.connections == 2


async def test_a_kept_alive_connection_closed_by_the_replica_is_retried_fresh() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if i == 0:
            await read_request(reader)  # the second request on it: closed unanswered
            return
        await keep_alive()(reader, writer, i)

    async with replica(handler) as (rep, url):
        c = client()
        for _ in range(2):
            resp = await c.post(url, b"{}", {})
            assert await resp.read() == b"{}"
            resp.release()
        await c.close()
    assert rep.connections == 2


async def test_a_fresh_connection_closed_unanswered_is_a_transport_error() -> None:
    async def handler(reader: asyncio.StreamReader, _w: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)

    async with replica(handler) as (rep, url):
        c = client()
        with pytest.raises(UpstreamClosed) as caught:
            await c.post(url, b"{}", {})
        await c.close()
    assert isinstance(caught.value, Http1Upstream.transport_errors)
    assert rep.connections == 1  # never retried on a connection that was never reused


async def test_a_body_cut_short_fails_the_read() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async with replica(handler) as (_rep, url):
        c = client()
        resp = await c.post(url, b"{}", {})
        with pytest.raises(UpstreamClosed):
            await resp.read()
        await c.close()


async def test_an_answer_that_is_not_http_is_a_protocol_error() -> None:
    async with replica(keep_alive(b"SSH-2.0-OpenSSH\r\n\r\n")) as (_rep, url):
        c = client()
        with pytest.raises(UpstreamProtocolError):
            await c.post(url, b"{}", {})
        await c.close()
    assert issubclass(UpstreamProtocolError, Http1Upstream.transport_errors)


async def test_a_refused_connection_is_a_transport_error() -> None:
    async with replica(keep_alive()) as (_rep, url):
        pass  # closed: nothing listens there now
    c = client()
    with pytest.raises(Http1Upstream.transport_errors):
        await c.post(url, b"{}", {})
    await c.close()


async def test_the_per_replica_cap_queues_requests_on_the_connections_it_has() -> None:
    gate = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        while True:
            await read_request(reader)
            await gate.wait()
            writer.write(OK)
            await writer.drain()

    async with replica(handler) as (rep, url):
        c = client(max_connections_per_replica=1)

        async def one() -> bytes:
            resp = await c.post(url, b"{}", {})
            body = await resp.read()
            resp.release()
            return body

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        await until(lambda: rep.connections == 1)
        gate.set()
        assert await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S) == [b"{}"] * 3
        await c.close()
    assert rep.connections == 1


async def test_waiting_past_the_connect_timeout_for_a_free_connection_fails() -> None:
    async def handler(reader: asyncio.StreamReader, _w: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)
        await asyncio.Event().wait()  # never answers

    async with replica(handler) as (_rep, url):
        c = client(max_connections_per_replica=1, connect_timeout_s=0.05)
        held = asyncio.create_task(c.post(url, b"{}", {}))
        await until(lambda: sum(len(p.open) for p in c._pools.values()) == 1)
        with pytest.raises(PoolTimeout):
            await c.post(url, b"{}", {})
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        # The cancelled request's connection was closed, and its slot is free again.
        assert sum(len(p.open) for p in c._pools.values()) == 0
        await c.close()


async def test_a_slow_reader_pauses_the_socket_and_resumes_it() -> None:
    size = 4 << 20

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()

    async with replica(handler) as (_rep, url):
        c = client()
        resp = await c.post(url, b"{}", {})
        conn = resp._conn
        assert isinstance(conn, _Connection)
        await until(lambda: conn._paused)
        got = 0
        while chunk := await asyncio.wait_for(resp.content.readany(), WAIT_S):
            got += len(chunk)
        assert got == size
        assert not conn._paused
        await c.close()


async def test_close_cuts_the_connection_mid_answer() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _i: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await reader.read()  # until the client's close

    async with replica(handler) as (rep, url):
        c = client()
        resp = await c.post(url, b"{}", {})
        assert await resp.content.readany() == b"a"
        resp.close()
        await until(lambda: rep.closed == 1)
        resp.release()  # after a close: nothing goes back to the pool
        assert sum(len(p.idle) for p in c._pools.values()) == 0
        await c.close()
