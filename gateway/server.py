"""Run the gateway under uvicorn (uvloop + httptools), in the foreground or inside a test."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import FrameType

import uvicorn

from gateway.config import GatewayConfig
from gateway.http_app import GatewayApp
from gateway.runtime import Runtime


class _Server(uvicorn.Server):
    """uvicorn, but readiness fails the moment a stop signal arrives (drain before exit)."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, own_signals: bool = True) -> None:
        super().__init__(config)
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


def _uvicorn_config(app: GatewayApp, cfg: GatewayConfig, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        # The gateway ends streams itself at drain_timeout_s (with an error event); uvicorn's
        # own cancellation is only the backstop.
        timeout_graceful_shutdown=math.ceil(cfg.server.drain_timeout_s) + 2,
        # Header-read deadline: uvicorn has no slowloris guard of its own beyond keep-alive.
        timeout_keep_alive=5,
        server_header=False,
        date_header=False,
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


async def serve(cfg: GatewayConfig, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM, then drain (uvicorn waits for open streams) and stop."""
    runtime = Runtime(cfg)
    server = _Server(_uvicorn_config(GatewayApp(runtime), cfg, log_level), runtime)
    sock = _bind(cfg.server.host, cfg.server.port)
    await server.serve(sockets=[sock])


@dataclass
class RunningGateway:
    """A gateway started inside the current event loop (tests, demo, benchmarks)."""

    url: str
    runtime: Runtime
    server: uvicorn.Server


@contextlib.asynccontextmanager
async def running_gateway(
    cfg: GatewayConfig, log_level: str = "warning"
) -> AsyncIterator[RunningGateway]:
    """Start the gateway on cfg's host/port (0 = ephemeral) and stop it on exit."""
    runtime = Runtime(cfg)
    config = _uvicorn_config(GatewayApp(runtime), cfg, log_level)
    server = _Server(config, runtime, own_signals=False)
    sock = _bind(cfg.server.host, cfg.server.port)
    host, port = sock.getsockname()[:2]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # surfaces the start-up error
                raise RuntimeError("gateway exited during start-up")
            await asyncio.sleep(0.01)
        yield RunningGateway(f"http://{host}:{port}", runtime, server)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=cfg.server.drain_timeout_s + 5)
        sock.close()
