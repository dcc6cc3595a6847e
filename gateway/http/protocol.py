"""uvicorn's httptools protocol with limits on the request head, connections and slow readers."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
from typing import Any, ClassVar, cast

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.config import ServerConfig
from gateway.http.send_watch import SendWatch
from gateway.http.transport import DISCONNECT_EXTENSION, DisconnectHook, LingeringTransport
from gateway.http.ws_protocol import GuardedWebSocketProtocol
from vllm_api.errors import error_body

# After a refusal, how long the client's further bytes are read and dropped before the close:
# closing with unread bytes makes the kernel send a reset, which can destroy the answer.
_LINGER_S = 1.0
# Never held to max_connections_per_client: a proxy on this host multiplexes many clients (as
# do the configured trusted_proxies).
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


class _HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a head that is over a limit."""


class GuardedHttpToolsProtocol(SendWatch, HttpToolsProtocol):
    """Caps the head, open connections (in all and per client) and a stalled client's hold."""

    # Set per server by guarded_protocol().
    max_header_bytes = 32768
    max_headers = 100
    header_timeout_s = 10.0
    max_connections = 0
    max_connections_per_client = 0
    keepalive_timeout_s = 5.0
    linger_timeout_s = 30.0
    linger_max_bytes = 256 * 1024 * 1024
    # Open connections per client address, shared by the server's connections.
    per_client: ClassVar[dict[str, int]] = {}
    # Addresses the per-client cap does not count.
    uncapped: ClassVar[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]] = LOOPBACK

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn's int is only ever handed to call_later: seconds as a float are fine.
        self.timeout_keep_alive = self.keepalive_timeout_s  # type: ignore[assignment]
        self._raw: asyncio.Transport | None = None
        # True while a head is expected or arriving: the only check a body chunk pays.
        self._in_head = True
        self._head_started = False
        self._head_bytes = 0
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        # The current head's deadline (loop time), None between heads: see _arm_head_timer.
        self._head_deadline: float | None = None
        self._refusal: tuple[int, str] | None = None
        self._refused = False
        self._client_key: str | None = None
        # Dropping the rest of a body answered early: bytes left, and close once it is read.
        self._draining = False
        self._drain_close = False
        self._drain_left = 0
        self._drain_timer: asyncio.TimerHandle | None = None
        # The current request's: an app task watching receive() for a disconnect costs a task
        # per request; the protocol knows first anyway.
        self._hook: DisconnectHook | None = None

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        if self.max_connections and len(self.connections) >= self.max_connections:
            # Not added to the server's connections: nothing of this one is tracked or drained.
            self.transport = transport
            self._refuse(503, "Too many open connections.")
            return
        self._raw = transport
        super().connection_made(LingeringTransport(transport, self))
        if self.max_connections_per_client and self.client is not None and self._capped():
            host = self.client[0]
            count = self.per_client.get(host, 0)
            if count >= self.max_connections_per_client:
                self.connections.discard(self)
                self._refuse(503, "Too many open connections from this client.")
                return
            self.per_client[host] = count + 1
            self._client_key = host
        # A connection that never sends a byte is held to the same deadline as a slow head.
        self._arm_head_timer()

    def _capped(self) -> bool:
        assert self.client is not None
        try:
            addr = ipaddress.ip_address(self.client[0])
        except ValueError:
            return True
        return not any(addr in net for net in self.uncapped)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client_gone()
        self._cancel_head_timer()
        self._stop_send_watch()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        if self._client_key is not None:
            self._drop_client(self._client_key)
            self._client_key = None
        super().connection_lost(exc)

    @classmethod
    def _drop_client(cls, host: str) -> None:
        left = cls.per_client[host] - 1
        if left:
            cls.per_client[host] = left
        else:
            del cls.per_client[host]

    def handle_websocket_upgrade(self) -> None:
        # The connection becomes the websocket protocol's, on the raw transport (a close there
        # is its own handshake, no linger); the client's slot goes with it, the head timer stops.
        self._cancel_head_timer()
        if self._raw is not None:
            if isinstance(self.transport, LingeringTransport):
                self.transport.flush()
            self.transport = self._raw
        host, self._client_key = self._client_key, None
        super().handle_websocket_upgrade()
        if host is None:
            return
        ws = self.transport.get_protocol()
        if isinstance(ws, GuardedWebSocketProtocol):
            ws.adopt(functools.partial(self._drop_client, host))
        else:
            self._drop_client(host)

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            if self._draining:
                self._drain_left -= len(data)
                if self._drain_left < 0:
                    self._close_now()
                    return
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
        # uvicorn's data_received, plus refusals raised from parser callbacks.
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            elif not self._refused:
                # uvicorn would answer its own text/plain 400; this is vLLM's JSON shape.
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(400, "Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            # A websocket upgrade goes to the ws protocol; any other is served as plain HTTP.
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_started = True
        self._header_count = 0
        if self._head_deadline is None:
            self._arm_head_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refusal = (431, "Too many request header fields.")
            raise _HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_deadline = None  # in time: the timer, when it fires, finds no head
        hook = self._hook = DisconnectHook()
        # The scope is the one uvicorn hands the app (built in on_message_begin).
        extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
        extensions[DISCONNECT_EXTENSION] = hook
        super().on_headers_complete()
        if self.cycle is not None:
            hook.attach(self.cycle)

    def _client_gone(self) -> None:
        """The client is gone (or refused mid-request): tell the open request, once."""
        cycle, hook = self.cycle, self._hook
        if hook is not None and cycle is not None and not cycle.response_complete:
            self._hook = None
            hook.fire()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # Any further bytes are the next request's head, counted from here.
        self._in_head = True
        self._head_started = False
        self._head_bytes = 0
        if self._draining:
            self._end_drain()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_pending():
            # Answered before the body was read (413, 401, ...): drop the rest, within bounds.
            self._drain_body(close=False)

    # --- a client that stops reading (gateway/http/send_watch.py) -----------------------

    def _watched(self) -> asyncio.WriteTransport | None:
        return self._raw

    # --- lingering close -----------------------------------------------------------------

    def _body_pending(self) -> bool:
        """The response is complete but the request's body is still arriving."""
        cycle = self.cycle
        return (
            not self._in_head
            and not self._refused
            and cycle is not None
            and cycle.response_complete
            and self._raw is not None
            and not self._raw.is_closing()
        )

    def close_requested(self) -> None:
        """uvicorn closes: at once, unless the client is still sending the answered body."""
        if self._body_pending():
            self._drain_body(close=True)
        else:
            self._close_now()

    def _drain_body(self, close: bool) -> None:
        self._drain_close = self._drain_close or close
        if self._draining:
            return
        self._draining = True
        self._drain_left = self.linger_max_bytes
        # uvicorn stops reading while the app holds an unread body; it is dropped now.
        self.flow.resume_reading()
        self._drain_timer = self.loop.call_later(self.linger_timeout_s, self._close_now)

    def _end_drain(self) -> None:
        """The whole answered body is read: close cleanly, or keep the connection alive."""
        self._draining = False
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        if self._drain_close:
            self._close_now()
            raise _HeadRefused  # stop parsing: a pipelined request behind it is not served
        # on_response_complete's idle timer was cancelled by the body's bytes: idle again now.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def _close_now(self) -> None:
        self._refused = True
        self._in_head = True
        self._draining = False
        if self._raw is not None:
            if isinstance(self.transport, LingeringTransport):
                self.transport.flush()
            self._raw.close()
        else:
            self.transport.close()

    # --- the head's deadline and refusals ------------------------------------------------

    def _arm_head_timer(self) -> None:
        # One timer per connection, re-armed when it fires rather than set and cancelled per
        # request: on a kept-alive connection under load the heads cost no timer at all.
        self._head_deadline = self.loop.time() + self.header_timeout_s
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_due)

    def _head_due(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        if deadline is None:
            return  # that head came in time; the next one arms the timer again
        left = deadline - self.loop.time()
        if left > 0:  # a later head than the one the timer was set for
            self._head_timer = self.loop.call_later(left, self._head_due)
            return
        self._head_timed_out()

    def _cancel_head_timer(self) -> None:
        self._head_deadline = None
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
            self._close_now()

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` in vLLM's shape, stop parsing and close after a short linger."""
        self._refused = True
        self._in_head = True
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started or self.pipeline:
                # A response is on the wire: an answer now would corrupt it.
                self._close_now()
                return
            # The app has not answered (a body it reads is malformed): to it the client is
            # gone, and its sends are dropped; the answer is this one.
            cycle.disconnected = True
            cycle.message_event.set()
            self._client_gone()
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
            self._head_timer = self.loop.call_later(_LINGER_S, self._close_now)
        else:
            self._close_now()


def guarded_protocol(server: ServerConfig) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with `server`'s limits."""

    class GatewayHttpProtocol(GuardedHttpToolsProtocol):
        max_header_bytes = server.max_header_bytes
        max_headers = server.max_headers
        header_timeout_s = server.header_timeout_s
        max_connections = server.max_connections
        max_connections_per_client = server.max_connections_per_client
        send_timeout_s = server.send_timeout_s
        keepalive_timeout_s = server.keepalive_timeout_s
        linger_timeout_s = server.linger_timeout_s
        linger_max_bytes = server.linger_max_bytes
        per_client: ClassVar[dict[str, int]] = {}
        uncapped = (
            *LOOPBACK,
            *(ipaddress.ip_network(c, strict=False) for c in server.trusted_proxies),
        )

    return GatewayHttpProtocol
