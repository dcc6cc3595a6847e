"""The process's one aiohttp client, and one upstream exchange from request to last chunk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from gateway.config import UpstreamConfig
from gateway.replicas.pool import Lease
from routing.types import Decision
from telemetry.tracing import RequestTrace


def make_session(cfg: UpstreamConfig) -> aiohttp.ClientSession:
    """One pooled client per process; limits are explicit so nothing caps connections silently."""
    connector = aiohttp.TCPConnector(
        limit=cfg.max_connections,
        limit_per_host=cfg.max_connections_per_replica,
        keepalive_timeout=cfg.keepalive_timeout_s,
        ttl_dns_cache=300,
    )
    return aiohttp.ClientSession(
        connector=connector,
        # Timeouts are applied per phase by the pipeline (first byte, idle gap), not in total.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


class StreamBroken(Exception):
    """The upstream stream failed after bytes were relayed; it must not be retried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class Exchange:
    """An upstream answer that has produced its first byte and now belongs to one client."""

    lease: Lease
    decision: Decision
    response: aiohttp.ClientResponse
    status: int
    # The whole body (non-streamed or error answers) or the first chunk of a stream.
    first: bytes
    streaming: bool
    idle_timeout_s: float
    started: float
    first_byte_at: float = field(default_factory=time.perf_counter)
    complete: bool = False
    # The request's trace, when traced: ended by Pipeline.finish.
    trace: RequestTrace | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream's chunks as they arrive, starting with the first; nothing is buffered."""
        yield self.first
        if not self.streaming:
            self.complete = True
            return
        content = self.response.content
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as deadline:
                while True:
                    deadline.reschedule(loop.time() + self.idle_timeout_s)
                    chunk = await content.readany()
                    # Off while the consumer holds the chunk: a slow client isn't an idle upstream.
                    deadline.reschedule(None)
                    if not chunk:
                        break
                    yield chunk
        except TimeoutError:
            raise StreamBroken("idle_timeout") from None
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise StreamBroken(type(exc).__name__) from None
        self.complete = True

    def close(self) -> None:
        """Free the upstream: a finished body goes back to the pool, anything else is cut now."""
        if self.complete:
            self.response.release()
        else:
            # Closing the socket is what makes vLLM abort the request and free its KV slot.
            self.response.close()
