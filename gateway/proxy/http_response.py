"""One upstream answer as the pipeline reads it: headers, and the body as it arrives."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator, Mapping
from typing import Protocol

# Above this many unread body bytes the socket stops being read (the replica is slowed down).
_HIGH_WATER = 1 << 18
_LOW_WATER = 1 << 16


class Carrier(Protocol):
    """The connection an answer arrives on (http_client's _Connection)."""

    loop: asyncio.AbstractEventLoop

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def done(self, response: Response) -> None: ...

    def close(self) -> None: ...


class ResponseHeaders(Mapping[str, str]):
    """A response's headers in arrival order; names may repeat (lower-case lookups)."""

    __slots__ = ("_items",)

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        return self._items

    def __getitem__(self, key: str) -> str:
        key = key.lower()
        for k, v in self._items:
            if k.lower() == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)


class Response:
    """One answer: its head is in; its body is read with readany/read (UpstreamResponse)."""

    __slots__ = ("_chunks", "_conn", "_exc", "_size", "_waiter", "eof", "headers", "status")

    def __init__(self, conn: Carrier, status: int, headers: ResponseHeaders) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._exc: BaseException | None = None
        self.eof = False

    @property
    def content(self) -> Response:
        return self

    # --- fed by the connection ----------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > _HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _end(self, exc: BaseException | None = None) -> None:
        if self.eof:
            return
        self.eof = True
        self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # --- read by the pipeline -------------------------------------------------------------

    async def readany(self) -> bytes:
        """What arrived since the last read, waiting for something; b"" at the body's end."""
        while not self._chunks:
            if self.eof:
                if self._exc is not None:
                    raise self._exc
                return b""
            await self._wait()
        data = self._chunks.popleft() if len(self._chunks) == 1 else self._take_all()
        self._size -= len(data)
        if self._size < _LOW_WATER:
            self._conn.resume()
        return data

    def _take_all(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data

    async def read(self, n: int = -1, /) -> bytes:
        """The whole body (n < 0), or up to `n` bytes of it."""
        if n < 0:
            while not self.eof:
                await self._wait()
            if self._exc is not None:
                raise self._exc
            data = self._take_all()
            self._size = 0
            self._conn.resume()
            return data
        data = await self.readany()
        if len(data) > n:
            self._chunks.appendleft(data[n:])
            self._size += len(data) - n
            data = data[:n]
        return data

    def release(self) -> None:
        """The body was read to its end: the connection goes back to the pool if it may."""
        self._conn.done(self)

    def close(self) -> None:
        """Cut the connection now (the replica aborts the request)."""
        self._conn.close()
