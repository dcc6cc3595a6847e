"""uvicorn's websockets protocol, with the HTTP protocol's send timeout and per-client count."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from gateway.config import ServerConfig

log = logging.getLogger("llm_gateway.http")


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """A client that reads nothing for send_timeout_s is cut, as on the HTTP protocol."""

    # Set per server by guarded_ws_protocol().
    send_timeout_s = 60.0

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_mark = 0
        # Handed over by the HTTP protocol on upgrade: frees the client's connection slot.
        self._release: Callable[[], None] | None = None

    def adopt(self, release: Callable[[], None]) -> None:
        """Call `release` once when this connection ends (the upgraded one's client slot)."""
        self._release = release

    def connection_lost(self, exc: Exception | None) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        release, self._release = self._release, None
        if release is not None:
            release()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None and self.transport is not None:
            self._send_mark = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_check)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_check(self) -> None:
        self._send_timer = None
        left = self.transport.get_write_buffer_size()
        if not left:
            return
        if left < self._send_mark:  # it read something: progress, another period
            self._send_mark = left
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_check)
            return
        log.warning(
            "websocket client %s read nothing for %g s: connection closed",
            self.client[0] if self.client else "?",
            self.send_timeout_s,
        )
        # A close waits for the buffer to flush, which it never will; the lost connection
        # wakes the app's pending send (ClientDisconnected), which ends the relay.
        self.transport.abort()


def guarded_ws_protocol(server: ServerConfig) -> type[GuardedWebSocketProtocol]:
    """The protocol class for uvicorn's `ws=`, with `server`'s send timeout."""

    class GatewayWebSocketProtocol(GuardedWebSocketProtocol):
        send_timeout_s = server.send_timeout_s

    return GatewayWebSocketProtocol
