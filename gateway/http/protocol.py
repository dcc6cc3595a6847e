"""uvicorn's httptools protocol with limits on the request head and on open connections."""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.config import ServerConfig
from vllm_api.errors import error_body

# After a refusal, how long the client's further bytes are read and dropped before the close:
# closing with unread bytes makes the kernel send a reset, which can destroy the answer.
_LINGER_S = 1.0


class _HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a head that is over a limit."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """Caps the head's bytes, header count and read time, and the number of open connections."""

    # Set per server by guarded_protocol().
    max_header_bytes = 32768
    max_headers = 100
    header_timeout_s = 10.0
    max_connections = 0

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # True while a head is expected or arriving: the only check a body chunk pays.
        self._in_head = True
        self._head_started = False
        self._head_bytes = 0
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        self._refused = False

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        if self.max_connections and len(self.connections) >= self.max_connections:
            # Not added to the server's connections: nothing of this one is tracked or drained.
            self.transport = transport
            self._refuse(503, "Too many open connections.")
            return
        super().connection_made(transport)
        # A connection that never sends a byte is held to the same deadline as a slow head.
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            self._feed(data)
            return
        if self._refused:
            return  # lingering: drop what the client still sends
        self._head_bytes += len(data)
        over = self._head_bytes - self.max_header_bytes
        if over <= 0:
            self._feed(data)
            return
        # The head may end inside this chunk, a body behind it: parse up to the limit only.
        keep = len(data) - over
        self._feed(data[:keep])
        if self.transport.is_closing() or self._refused:
            return
        if self._in_head:
            self._refuse(431, "Request header fields too large.")
            return
        self.data_received(data[keep:])

    def _feed(self, data: bytes) -> None:
        # uvicorn's data_received, plus a refusal raised from a parser callback.
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_started = True
        self._header_count = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refusal = (431, "Too many request header fields.")
            raise _HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # Any further bytes are the next request's head, counted from here.
        self._in_head = True
        self._head_started = False
        self._head_bytes = 0

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_started:
            self._refuse(408, "Timed out reading the request headers.")
        else:
            # Nothing sent (a silent or pre-opened connection): no request to answer.
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` in vLLM's shape, stop parsing and close after a short linger."""
        self._refused = True
        self._in_head = True
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        if self.cycle is not None and not self.cycle.response_complete:
            # A response is on the wire: an answer now would corrupt it.
            self.transport.close()
            return
        body = error_body(message, status)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(head))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._head_timer = self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded_protocol(server: ServerConfig) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with `server`'s limits."""

    class GatewayHttpProtocol(GuardedHttpToolsProtocol):
        max_header_bytes = server.max_header_bytes
        max_headers = server.max_headers
        header_timeout_s = server.header_timeout_s
        max_connections = server.max_connections

    return GatewayHttpProtocol
