"""The HTTP front end's server: uvicorn (uvloop + httptools) on a socket the caller binds."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from gateway.http.app import GatewayApp
from gateway.http.gc_policy import tune_for_serving
from gateway.http.protocol import guarded_protocol
from gateway.http.ws_protocol import guarded_ws_protocol
from gateway.runtime import Runtime


class HttpServer(uvicorn.Server):
    """uvicorn, but readiness fails the moment a stop signal arrives (drain before exit)."""

    def __init__(
        self,
        runtime: Runtime,
        log_level: str,
        own_signals: bool = True,
        wrap: Callable[[ASGIApp], ASGIApp] | None = None,
        on_started: Callable[[], None] = lambda: None,
    ) -> None:
        # `wrap`: a worker of several puts its sibling-aware routes in front of the app.
        app: ASGIApp = GatewayApp(runtime)
        super().__init__(_uvicorn_config(wrap(app) if wrap else app, runtime, log_level))
        self.runtime = runtime
        self._own_signals = own_signals
        self._on_started = on_started
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
        if self._own_signals:
            # The process is ours (not a test's or the demo's): start-up is over, freeze it.
            tune_for_serving()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started()  # listening: a supervisor may count this worker as up


def _uvicorn_config(app: ASGIApp, runtime: Runtime, log_level: str) -> uvicorn.Config:
    drain_timeout_s = runtime.config.server.drain_timeout_s
    return uvicorn.Config(
        app,
        loop="uvloop",
        # httptools, plus the head limits, connection caps, send timeout and lingering close
        # uvicorn lacks.
        http=guarded_protocol(runtime.config.server),
        # /v1/realtime: the upgraded connection keeps the send timeout and client count
        # (http/ws_protocol.py); its relay bounds idle time. No compression: a relay would
        # inflate and deflate every frame on the event loop.
        # A drain (SIGTERM) keeps open sessions until they end or drain_timeout_s passes.
        ws=guarded_ws_protocol(runtime.config.server, lambda: runtime.draining),
        ws_max_size=runtime.config.server.realtime_max_message_bytes,
        ws_per_message_deflate=False,
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
        # The gateway applies its own trusted_proxies policy to X-Forwarded-For
        # (proxy/headers.py); uvicorn's middleware would cost every request a call layer.
        proxy_headers=False,
    )


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening-ready, non-blocking TCP socket on host:port (0 = ephemeral)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        # Several workers listen on one port and the kernel spreads connections among them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
