"""uvicorn's websockets protocol, with the HTTP protocol's send timeout and per-client count."""

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

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_send_watch()
        release, self._release = self._release, None
        if release is not None:
            release()
        super().connection_lost(exc)

    def _watched(self) -> asyncio.WriteTransport | None:
        # The lost connection wakes the app's pending send (ClientDisconnected): the relay ends.
        return self.transport


def guarded_ws_protocol(server: ServerConfig) -> type[GuardedWebSocketProtocol]:
    """The protocol class for uvicorn's `ws=`, with `server`'s send timeout."""

    class GatewayWebSocketProtocol(GuardedWebSocketProtocol):
        send_timeout_s = server.send_timeout_s

    return GatewayWebSocketProtocol
