"""A closed-loop HTTP/1.1 load generator: N keep-alive connections, one request in flight each.

A raw asyncio.Protocol (run it under uvloop) so that the client costs less than what it measures:
it parses just enough HTTP (status, content-length or chunked) to time each request from send to
last byte, and for SSE streams counts events, HTTP chunks and the time to the first chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import orjson

_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER = range(5)
_DONE = b"data: [DONE]\n\n"


class LoadgenError(Exception):
    """The load generator could not run a round (connect failure or a hung drain)."""


def chat_request(
    host: str, port: int, model: str, stream: bool, headers: Mapping[str, str] = {}
) -> bytes:
    """The raw bytes of one small chat-completion request, with `headers` added to its head."""
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
            "stream": stream,
        }
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    )
    return head.encode() + body


@dataclass(slots=True)
class RoundResult:
    """What one closed-loop round measured inside its window (drained requests excluded)."""

    duration_s: float
    requests: int
    errors: int
    latencies_s: list[float]
    ttfc_s: list[float]
    events: int
    http_chunks: int
    cpu_s: dict[str, float]
    error_kinds: dict[str, int] = field(default_factory=dict)
    # SSE events per streamed answer: as expected, or as learned from the first answer.
    events_per_answer: int | None = None


class _Shared:
    """State all connections of one round update from their callbacks."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stream: bool, expect_events: int | None
    ) -> None:
        self.stream = stream
        self.expect_events = expect_events
        self.open = False
        self.busy = 0
        self.latencies: list[float] = []
        self.ttfc: list[float] = []
        self.completed = 0
        self.events = 0
        self.http_chunks = 0
        self.errors: dict[str, int] = {}
        self.drained: asyncio.Future[None] = loop.create_future()

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class _Client(asyncio.Protocol):
    """One keep-alive connection driving requests back to back."""

    def __init__(self, shared: _Shared, request: bytes) -> None:
        self._shared = shared
        self._request = request
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._state = _HEAD
        self._status = 0
        self._remaining = 0
        self._sent = 0.0
        self._first = 0.0
        self._events = 0
        self._last_nl = False
        self._tail = b""
        self._in_flight = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._in_flight:
            self._in_flight = False
            self._shared.error("connection_lost")
            self._idle()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def send(self) -> None:
        if self._transport is None:
            self._shared.error("connection_lost")
            self._idle()
            return
        self._state = _HEAD
        self._events = 0
        self._last_nl = False
        self._tail = b""
        self._first = 0.0
        self._in_flight = True
        self._sent = time.perf_counter()
        self._transport.write(self._request)

    def _idle(self) -> None:
        shared = self._shared
        shared.busy -= 1
        if shared.busy == 0 and not shared.drained.done():
            shared.drained.set_result(None)

    def _finish(self, ok: bool, kind: str) -> None:
        now = time.perf_counter()
        self._in_flight = False
        shared = self._shared
        if not ok:
            shared.error(kind)
            # The rest of the connection's bytes cannot be trusted: drop it, the round goes on.
            if self._transport is not None:
                self._transport.close()
                self._transport = None
        elif shared.open:
            shared.completed += 1
            shared.latencies.append(now - self._sent)
            if shared.stream:
                shared.ttfc.append(self._first - self._sent)
        if shared.open and self._transport is not None:
            self.send()
        else:
            self._idle()

    def _payload(self, size: int) -> None:
        # Counted in place: a "\n\n" split across two chunks is caught by remembering the last byte.
        buf = self._buf
        if self._first == 0.0:
            self._first = time.perf_counter()
        n = buf.count(b"\n\n", 0, size)
        if self._last_nl and size and buf[0] == 10:
            n += 1
        self._last_nl = size > 0 and buf[size - 1] == 10
        self._events += n
        self._tail = (self._tail + bytes(buf[max(0, size - 16) : size]))[-16:]
        shared = self._shared
        if shared.open:
            shared.events += n
            shared.http_chunks += 1

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while self._in_flight:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).lower()
                del buf[: end + 4]
                self._status = int(head[9:12])
                if b"\r\ntransfer-encoding: chunked" in head:
                    self._state = _CHUNK_SIZE
                    continue
                at = head.find(b"\r\ncontent-length:")
                if at < 0:
                    self._finish(False, "no_length")
                    return
                stop = head.find(b"\r\n", at + 2)
                self._remaining = int(head[at + 17 : stop if stop >= 0 else len(head)])
                self._state = _BODY
            elif state == _BODY:
                if len(buf) < self._remaining:
                    return
                if self._status == 200 and self._shared.stream:
                    self._payload(self._remaining)
                del buf[: self._remaining]
                self._done()
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[: end + 2]
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _CHUNK_DATA:
                if len(buf) < self._remaining + 2:
                    return
                self._payload(self._remaining)
                del buf[: self._remaining + 2]
                self._state = _CHUNK_SIZE
            else:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[: end + 2]
                if end == 0:
                    self._done()

    def _done(self) -> None:
        shared = self._shared
        if self._status != 200:
            self._finish(False, f"status_{self._status}")
            return
        ended = self._tail.endswith(_DONE)
        if shared.stream and shared.expect_events is None and ended:
            # A peer may re-frame the stream: its first whole answer sets the count to hold to.
            shared.expect_events = self._events
        if shared.stream and (self._events != shared.expect_events or not ended):
            self._finish(False, "bad_stream")
        else:
            self._finish(True, "")


async def run_round(
    host: str,
    port: int,
    request: bytes,
    *,
    concurrency: int,
    duration_s: float,
    stream: bool,
    expect_events: int | None,
    cpu_snapshot: Callable[[], Mapping[str, float]],
    timeout_s: float = 10.0,
) -> RoundResult:
    """Open `concurrency` connections, drive them for `duration_s`, then drain and close them.

    `expect_events`: SSE events (incl. [DONE]) every streamed answer must have; None learns it
    from the first answer that ends with [DONE]. `timeout_s` bounds the connect and the drain.
    """
    loop = asyncio.get_running_loop()
    shared = _Shared(loop, stream, expect_events)
    try:
        async with asyncio.timeout(timeout_s):
            pairs = await asyncio.gather(
                *(
                    loop.create_connection(lambda: _Client(shared, request), host, port)
                    for _ in range(concurrency)
                )
            )
    except (OSError, TimeoutError) as exc:
        raise LoadgenError(f"cannot connect to {host}:{port}: {exc!r}") from None
    clients = [proto for _, proto in pairs]
    window: asyncio.Future[tuple[float, dict[str, float]]] = loop.create_future()
    try:
        cpu0 = dict(cpu_snapshot())
        t0 = time.perf_counter()
        shared.open = True
        shared.busy = concurrency
        for client in clients:
            client.send()

        def close_window() -> None:
            shared.open = False
            cpu1 = cpu_snapshot()
            window.set_result((time.perf_counter() - t0, {k: cpu1[k] - cpu0[k] for k in cpu0}))

        loop.call_later(duration_s, close_window)
        async with asyncio.timeout(duration_s + timeout_s):
            elapsed, cpu = await window
        try:
            async with asyncio.timeout(timeout_s):
                await shared.drained
        except TimeoutError:
            shared.errors["drain_timeout"] = shared.busy
    finally:
        for client in clients:
            client.close()
    return RoundResult(
        duration_s=elapsed,
        requests=shared.completed,
        errors=sum(shared.errors.values()),
        latencies_s=shared.latencies,
        ttfc_s=shared.ttfc,
        events=shared.events,
        http_chunks=shared.http_chunks,
        cpu_s=cpu,
        error_kinds=dict(shared.errors),
        events_per_answer=shared.expect_events if stream else None,
    )
