"""The hot path's HTTP/1.1 client to the replicas: pooled keep-alive connections, httptools.

Measured beside aiohttp's client (wrk c=64 -> gateway -> nginx): aiohttp spent ~28% of the
gateway's CPU per request building its request, writer, response and multidict objects. This
client does what the pipeline needs and no more: one write per request (head and body), a
parser callback per event, the body as it arrives (bounded buffer, reading paused above it).
The health and score loops keep aiohttp (a few requests a second).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.config import UpstreamConfig
from gateway.proxy.http_response import Response, ResponseHeaders


class UpstreamProtocolError(ConnectionError):
    """The replica's answer was not HTTP/1.1 this client can parse."""


class UpstreamClosed(ConnectionError):
    """The replica closed the connection before its answer was complete."""


class PoolTimeout(ConnectionError):
    """No connection to the replica became free within the connect timeout."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica, one request at a time."""

    def __init__(self, pool: _HostPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[Response] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._response: Response | None = None
        self._complete = False
        self._keep_alive = False
        self._paused = False
        self.idle_since = 0.0
        self.closed = False
        # Reused from the pool, and nothing of the current answer has arrived yet.
        self.reused = False
        self.received = False

    # --- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"bad HTTP answer from the replica: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.lost(self)
        response = self._response
        if response is not None and not self._complete and self._headers_only_eof():
            # No content-length, not chunked: the body is everything up to the close.
            self._complete = True
            response._end()
            return
        self._fail(UpstreamClosed("the replica closed the connection") if exc is None else exc)

    # --- httptools callbacks --------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self._headers = []  # an interim 1xx answer: the real head follows
            return
        # Asked now: once the message completes the parser has reset its flags.
        self._keep_alive = self._parser.should_keep_alive()
        response = Response(self, status, ResponseHeaders(self._headers))
        self._response = response
        head = self._head
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        if self._response is None:
            return  # the end of a 1xx answer
        self._complete = True
        self._response._end()

    # --- used by the pool and the response ------------------------------------------------

    def _headers_only_eof(self) -> bool:
        names = {k for k, _ in self._headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def send(self, head: bytes, body: bytes) -> asyncio.Future[Response]:
        """Write one request; the future is done once the answer's head has arrived."""
        assert self.transport is not None
        self._head = fut = self.loop.create_future()
        self._headers = []
        self._response = None
        self._complete = False
        self.received = False
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return fut

    def _fail(self, exc: BaseException) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        if self._response is not None and not self._complete:
            self._response._end(exc)
        self.close()

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def done(self, response: Response) -> None:
        """The response was consumed: pool the connection if the answer ended cleanly."""
        if response is not self._response:
            return
        reusable = self._complete and not self.closed and self._keep_alive
        self._response = None
        self._head = None
        if reusable:
            self.resume()
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.lost(self)
            if self.transport is not None:
                self.transport.close()


class _HostPool:
    """The connections to one replica: idle ones (most recent first) and the count open."""

    def __init__(self, client: Http1Client, host: str, port: int) -> None:
        self.client = client
        self.host = host
        self.port = port
        self.idle: list[_Connection] = []
        self.open: set[_Connection] = set()
        self.hostport = f"{host}:{port}"

    def put(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        if not self.client.hand_over(self, conn):
            self.idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        if conn in self.open:
            self.open.discard(conn)
            self.client.freed(self)
        if conn in self.idle:
            self.idle.remove(conn)


class Http1Client:
    """Pooled HTTP/1.1 connections to the replicas, within [upstream]'s limits."""

    def __init__(self, cfg: UpstreamConfig) -> None:
        self._cfg = cfg
        self._pools: dict[tuple[str, int], _HostPool] = {}
        self._urls: dict[str, tuple[_HostPool, bytes]] = {}
        self._open = 0
        # Requests waiting for a connection slot, per pool.
        self._waiters: dict[_HostPool, collections.deque[asyncio.Future[_Connection | None]]] = {}

    def _target(self, url: str) -> tuple[_HostPool, bytes]:
        found = self._urls.get(url)
        if found is None:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or 80
            pool = self._pools.get((host, port))
            if pool is None:
                pool = self._pools[(host, port)] = _HostPool(self, host, port)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            found = self._urls[url] = (pool, path.encode("latin-1"))
            if len(self._urls) > 4096:  # replicas come and go: keep the memo bounded
                self._urls.clear()
        return found

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST `body`; returns once the answer's status line and headers have arrived."""
        return await self.send(b"POST ", url, body, headers)

    async def get(self, url: str, headers: Mapping[str, str]) -> Response:
        """GET `url`; returns once the answer's status line and headers have arrived."""
        return await self.send(b"GET ", url, None, headers)

    async def send(
        self, method: bytes, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Response:
        """`method` ("POST ", "GET ") `url`, with `body` unless None; done once the head came."""
        pool, path = self._target(url)
        conn = await self._acquire(pool)
        head = self._head_bytes(method, pool, path, body, headers)
        body = body or b""
        try:
            return await conn.send(head, body)
        except (UpstreamClosed, ConnectionResetError, BrokenPipeError):
            # A kept-alive connection the replica closed as we reused it: once more, fresh.
            if not (conn.reused and not conn.received):
                raise
        except BaseException:
            conn.close()
            raise
        conn = await self._acquire(pool, fresh=True)
        try:
            return await conn.send(head, body)
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _head_bytes(
        method: bytes, pool: _HostPool, path: bytes, body: bytes | None, headers: Mapping[str, str]
    ) -> bytes:
        lines = [method, path, b" HTTP/1.1\r\nhost: ", pool.hostport.encode("latin-1")]
        # A GET has no body, so no content-length (RFC 9110 9.3.1).
        lines.append(b"\r\n" if body is None else b"\r\ncontent-length: %d\r\n" % len(body))
        for k, v in headers.items():
            lines += (k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def _acquire(self, pool: _HostPool, fresh: bool = False) -> _Connection:
        keepalive = self._cfg.keepalive_timeout_s
        now = time.monotonic()
        while pool.idle and not fresh:
            conn = pool.idle.pop()
            if not conn.closed and now - conn.idle_since < keepalive:
                conn.reused = True
                return conn
            conn.close()
        cfg = self._cfg
        if self._open >= cfg.max_connections or len(pool.open) >= cfg.max_connections_per_replica:
            conn_or_slot = await self._wait_for_slot(pool)
            if conn_or_slot is not None:
                conn_or_slot.reused = True
                return conn_or_slot
        return await self._connect(pool)

    async def _wait_for_slot(self, pool: _HostPool) -> _Connection | None:
        """A connection handed over by a finished request, or None: a slot to connect in."""
        fut: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        queue = self._waiters.setdefault(pool, collections.deque())
        queue.append(fut)
        try:
            async with asyncio.timeout(self._cfg.connect_timeout_s):
                return await fut
        except BaseException as exc:
            if fut in queue:
                queue.remove(fut)
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                # Handed over as we timed out or were cancelled: pass it on, don't lose it.
                conn = fut.result()
                if conn is not None:
                    pool.put(conn)
                else:
                    self._wake_slot(pool)
            if isinstance(exc, TimeoutError):
                raise PoolTimeout(f"no free connection to {pool.hostport}") from None
            raise

    async def _connect(self, pool: _HostPool) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(pool, loop)
        pool.open.add(conn)
        self._open += 1
        try:
            async with asyncio.timeout(self._cfg.connect_timeout_s):
                await loop.create_connection(lambda: conn, pool.host, pool.port)
        except TimeoutError:
            conn.close()
            raise UpstreamClosed(f"connect to {pool.hostport} timed out") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def hand_over(self, pool: _HostPool, conn: _Connection) -> bool:
        """Give a freed connection to a request waiting for one; False when none waits."""
        queue = self._waiters.get(pool)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(conn)
                return True
        return False

    def freed(self, pool: _HostPool) -> None:
        """A connection closed: a waiting request may open one in its place."""
        self._open -= 1
        self._wake_slot(pool)

    def _wake_slot(self, pool: _HostPool) -> None:
        # This replica's waiters first, then any other replica's that is under its own cap.
        per_replica = self._cfg.max_connections_per_replica
        for candidate in (pool, *self._waiters):
            queue = self._waiters.get(candidate)
            if not queue or len(candidate.open) >= per_replica:
                continue
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)
                    return

    async def close(self) -> None:
        """Close every connection (idle or busy)."""
        for pool in self._pools.values():
            for conn in list(pool.open):
                conn.close()


class Http1Upstream:
    """The production Upstream (gateway/proxy/upstream.py's seam) over Http1Client."""

    __slots__ = ("client", "get", "post")

    # Refused, reset, closed early, unparsable answer, no free connection: all OSErrors.
    # (TimeoutError is one too; the pipeline catches it first, as a timeout.)
    transport_errors: tuple[type[Exception], ...] = (OSError,)

    def __init__(self, cfg: UpstreamConfig) -> None:
        self.client = Http1Client(cfg)
        # Bound straight to the client's send: no extra coroutine frame on the hot path.
        self.post = functools.partial(self.client.send, b"POST ")
        self.get = self.client.get
