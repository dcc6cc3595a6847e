"""uvicorn's websockets protocol, with the HTTP protocol's send timeout and per-client count.

At shutdown uvicorn closes every socket at once with 1012. A draining gateway instead keeps
them open: /v1/realtime's relay lets each session run until it ends or the drain period does
(then it closes them with 1012 itself), as HTTP streams are drained.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from gateway.config import ServerConfig
from gateway.http.send_watch import SendWatch


class GuardedWebSocketProtocol(SendWatch, WebSocketsSansIOProtocol):
    """A client that reads nothing for send_timeout_s is cut, as on the HTTP protocol."""

    watched_kind = "websocket client"
    # Whether the gateway drains (sessions stay open at shutdown); set by guarded_ws_protocol.
    draining: Callable[[], bool] = staticmethod(lambda: False)

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # Handed over by the HTTP protocol on upgrade: frees the client's connection slot.
        self._release: Callable[[], None] | None = None

    def adopt(self, release: Callable[[], None]) -> None:
        """Call `release` once when this connection ends (the upgraded one's client slot)."""
        self._release = release

    def shutdown(self) -> None:
        # A socket already closing, or an embedded gateway's stop: uvicorn's own way.
        if self.close_sent or not self.draining():
            super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_send_watch()
        release, self._release = self._release, None
        if release is not None:
            release()
        super().connection_lost(exc)

    def _watched(self) -> asyncio.WriteTransport | None:
        # The lost connection wakes the app's pending send (ClientDisconnected): the relay ends.
        return self.transport


def guarded_ws_protocol(
    server: ServerConfig, draining: Callable[[], bool] = lambda: False
) -> type[GuardedWebSocketProtocol]:
    """uvicorn's `ws=` class: `server`'s send timeout; sessions outlive shutdown if `draining`."""

    class GatewayWebSocketProtocol(GuardedWebSocketProtocol):
        send_timeout_s = server.send_timeout_s

    GatewayWebSocketProtocol.draining = staticmethod(draining)

    return GatewayWebSocketProtocol
