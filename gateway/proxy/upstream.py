"""The seam to the replicas (Upstream), the loops' aiohttp session, and one upstream exchange."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import aiohttp

from gateway.config import UpstreamConfig
from gateway.proxy.usage import prompt_usage, usage_marked, usage_tokens
from gateway.replicas.pool import Lease
from routing.types import Decision, RequestFeatures
from telemetry.tracing import RequestTrace

if TYPE_CHECKING:
    from gateway.proxy.tenancy import Grant

# Longer than any usage mark: enough of the previous read to find one cut in two.
_MARK_TAIL = 24

# The contract follows aiohttp's response shape (so a ClientResponse still fits it); the
# production implementation is proxy/http_client.py's Http1Upstream, whose response is read
# directly: no adapter object and no extra await per chunk.


class BodyReader(Protocol):
    """A response body as it arrives from the replica."""

    async def readany(self) -> bytes:
        """What arrived since the last read, waiting for something; b"" once the body ended."""
        ...

    async def read(self, n: int = -1, /) -> bytes:
        """Up to `n` bytes of the body (-1: all of it)."""
        ...


class UpstreamResponse(Protocol):
    """A replica's answer once its status line and headers are in (aiohttp's ClientResponse)."""

    @property
    def status(self) -> int: ...

    # A name may repeat (aiohttp's multidict): iterate items(), don't build a dict of it.
    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> BodyReader: ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def release(self) -> object:
        """The body was read to its end: the connection may serve another request."""
        ...

    def close(self) -> None:
        """Cut the connection now; vLLM aborts the request and frees its KV slot."""
        ...


class Upstream(Protocol):
    """Sends one request to a replica: what the pipeline calls, and what tests fake."""

    # What its calls and its responses' reads raise when the transport fails (refused, reset,
    # cut body). They cross the seam as they are: their class name is the retry reason, a
    # metric label, so each implementation names its own instead of wrapping them.
    @property
    def transport_errors(self) -> tuple[type[Exception], ...]: ...

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> Awaitable[UpstreamResponse]:
        """POST `body` to `url`; done once the status line and headers have arrived."""
        ...

    def get(self, url: str, headers: Mapping[str, str]) -> Awaitable[UpstreamResponse]:
        """GET `url` (a stored response); done once the status line and headers have arrived."""
        ...


def make_session(cfg: UpstreamConfig) -> aiohttp.ClientSession:
    """The health, score and KV loops' pooled client; limits explicit, none capped silently."""
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
    response: UpstreamResponse
    status: int
    # The whole body (non-streamed or error answers) or the first chunk of a stream.
    first: bytes
    streaming: bool
    idle_timeout_s: float
    started: float
    # The upstream's transport errors: any of them after the first byte breaks the stream.
    transport_errors: tuple[type[Exception], ...]
    first_byte_at: float = field(default_factory=time.perf_counter)
    complete: bool = False
    # The request's trace, when traced: ended by Pipeline.finish.
    trace: RequestTrace | None = None
    # The tenant's quota reservation, settled by Pipeline.finish from `used_tokens`.
    grant: Grant | None = None
    # prompt + completion tokens of a stream's usage chunk, when one was seen (and wanted).
    usage: int | None = None
    # Read a stream's usage chunk even without a token quota (the request log wants it, or
    # the gateway's token estimate learns from it).
    want_usage: bool = False
    # The usage object's bytes as last seen in a stream (prompt tokens are read from it).
    usage_data: bytes = b""
    # The features it was routed on (their prompt's characters pair with the usage's count).
    features: RequestFeatures | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream's chunks as they arrive, starting with the first; nothing is buffered."""
        yield self.first
        if not self.streaming:
            self.complete = True
            return
        # Read the usage chunk only for a token quota or the request log, and then only the
        # chunks that may hold it.
        tap = self.want_usage or (self.grant is not None and self.grant.wants_usage)
        prev = self.first
        if tap and usage_marked(prev):
            self.usage, self.usage_data = usage_tokens(prev), prev
        readany = self.response.content.readany
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as deadline:
                while True:
                    deadline.reschedule(loop.time() + self.idle_timeout_s)
                    chunk = await readany()
                    # Off while the consumer holds the chunk: a slow client isn't an idle upstream.
                    deadline.reschedule(None)
                    if not chunk:
                        break
                    if tap:
                        # A mark cut by the read boundary is found with the previous tail.
                        if usage_marked(prev[-_MARK_TAIL:] + chunk):
                            # The event may have begun in the previous read.
                            found = usage_tokens(chunk)
                            data = chunk if found is not None else prev + chunk
                            self.usage = found if found is not None else usage_tokens(data)
                            self.usage_data = data
                        prev = chunk
                    yield chunk
        except TimeoutError:
            raise StreamBroken("idle_timeout") from None
        except self.transport_errors as exc:
            raise StreamBroken(type(exc).__name__) from None
        self.complete = True

    def used_tokens(self) -> int | None:
        """The tokens the answer says it used; 0 for an error answer, None when unknown."""
        if self.status >= 400:
            return 0
        if self.streaming:
            return self.usage
        return usage_tokens(self.first)

    def prompt_tokens(self) -> int | None:
        """The prompt tokens the answer says it counted; None when unknown or an error."""
        if self.status >= 400:
            return None
        return prompt_usage(self.usage_data if self.streaming else self.first)

    def close(self) -> None:
        """Free the upstream: a finished body goes back to the pool, anything else is cut now."""
        if self.complete:
            self.response.release()
        else:
            # Closing the socket is what makes vLLM abort the request and free its KV slot.
            self.response.close()
