"""A raw TCP connection to a running gateway, for tests about the bytes on the wire."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from gateway.process import RunningGateway

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def connect(gw: RunningGateway, source: str = "127.0.0.1") -> AsyncIterator[Conn]:
    """A connection to `gw` from the local address `source`, closed on exit."""
    url = urlsplit(gw.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port, local_addr=(source, 0))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
