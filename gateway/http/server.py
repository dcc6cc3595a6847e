"""The HTTP front end's server: uvicorn (uvloop + httptools) on a socket the caller binds."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
from collections.abc import Iterator
from types import FrameType

import uvicorn

from gateway.http.app import GatewayApp
from gateway.http.protocol import guarded_protocol
from gateway.runtime import Runtime


class HttpServer(uvicorn.Server):
    """uvicorn, but readiness fails the moment a stop signal arrives (drain before exit)."""

    def __init__(self, runtime: Runtime, log_level: str, own_signals: bool = True) -> None:
        super().__init__(_uvicorn_config(GatewayApp(runtime), runtime, log_level))
        self.runtime = runtime
        self._own_signals = own_signals
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # An embedded gateway (tests, demo) leaves signals to whoever owns the process.
        if not self._own_signals:
            yield
            return
        # Like uvicorn's, minus re-raising the signal afterwards: a clean drain exits with 0.
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None:
            self.runtime.begin_drain(self._loop)
        super().handle_exit(sig, frame)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)


def _uvicorn_config(app: GatewayApp, runtime: Runtime, log_level: str) -> uvicorn.Config:
    drain_timeout_s = runtime.config.server.drain_timeout_s
    return uvicorn.Config(
        app,
        loop="uvloop",
        # httptools, plus the head limits, connection caps, send timeout and lingering close
        # uvicorn lacks.
        http=guarded_protocol(runtime.config.server),
        # No websockets: an upgrade would hand the connection to a protocol without those.
        ws="none",
        # The runtime is started (and stopped) by the process, beside the gRPC front end.
        lifespan="off",
        log_level=log_level,
        access_log=False,
        # The gateway ends streams itself at drain_timeout_s (with an error event); uvicorn's
        # own cancellation is only the backstop.
        timeout_graceful_shutdown=math.ceil(drain_timeout_s) + 2,
        # The idle time between requests on a kept-alive connection is [server]
        # keepalive_timeout_s and the head's own deadline header_timeout_s, in the protocol.
        server_header=False,
        date_header=False,
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready, non-blocking TCP socket on host:port (0 = ephemeral)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock
