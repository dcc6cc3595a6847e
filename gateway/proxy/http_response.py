"""One upstream answer as the pipeline reads it: headers, and the body as it arrives."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, overload

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


class HeaderItems(Sequence[tuple[str, str]]):
    """A response's (name, value) pairs, decoded as read; `raw` holds them as received."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(index, slice):
            return [_decoded(p) for p in self.raw[index]]
        return _decoded(self.raw[index])

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return map(_decoded, self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def _decoded(pair: tuple[bytes, bytes]) -> tuple[str, str]:
    return pair[0].decode("latin-1"), pair[1].decode("latin-1")


class ResponseHeaders(Mapping[str, str]):
    """A response's headers in arrival order; names may repeat (lower-case lookups)."""

    # Kept as bytes (names lower-cased): the client's answer is sent with them as they came,
    # so most never need decoding (a decode and re-encode per header was ~3 us a request).
    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def items(self) -> HeaderItems:  # type: ignore[override]
        return HeaderItems(self.raw)

    def __getitem__(self, key: str) -> str:
        name = key.lower().encode("latin-1")
        for k, v in self.raw:
            if k == name:
                return v.decode("latin-1")
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k.decode("latin-1") for k, _ in self.raw)

    def __len__(self) -> int:
        return len(self.raw)


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
