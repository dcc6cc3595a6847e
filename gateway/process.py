"""One gateway process: the runtime, then the HTTP and gRPC front ends as siblings over it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from gateway.admin.reload import install_sighup
from gateway.config import GatewayConfig
from gateway.grpc.server import GrpcFrontEnd
from gateway.http.server import HttpServer, bind
from gateway.runtime import Runtime


@contextlib.asynccontextmanager
async def started(
    runtime: Runtime, grpc_port: int | None = None
) -> AsyncIterator[GrpcFrontEnd | None]:
    """The runtime's loops and, when enabled, the gRPC front end; stopped in reverse.

    `grpc_port` replaces the configured port (a worker's, reserved by its supervisor)."""
    await runtime.start()
    try:
        grpc_cfg = runtime.config.grpc
        if grpc_port is not None:
            grpc_cfg = replace(grpc_cfg, port=grpc_port)
        front = GrpcFrontEnd(runtime, grpc_cfg) if grpc_cfg.enabled else None
        if front is None:
            yield None
            return
        await front.start()
        try:
            yield front
        finally:
            await front.stop(runtime.config.server.drain_timeout_s)
    finally:
        await runtime.stop()


async def serve(cfg: GatewayConfig, log_level: str = "info", config_path: str = "") -> None:
    """Serve until SIGINT/SIGTERM, then drain (HTTP streams, then gRPC calls) and stop.

    SIGHUP re-reads `config_path` (gateway/admin/reload.py)."""
    runtime = Runtime(cfg)
    runtime.config_path = config_path or None
    sock = bind(cfg.server.host, cfg.server.port)
    try:
        async with started(runtime):
            install_sighup(runtime)
            await HttpServer(runtime, log_level).serve(sockets=[sock])
    finally:
        sock.close()


@dataclass
class RunningGateway:
    """A gateway started inside the current event loop (tests, demo, benchmarks)."""

    url: str
    runtime: Runtime
    server: HttpServer
    # The gRPC front end when [grpc] is enabled (its bound port is `grpc.port`).
    grpc: GrpcFrontEnd | None = None


@contextlib.asynccontextmanager
async def running_gateway(
    cfg: GatewayConfig, log_level: str = "warning"
) -> AsyncIterator[RunningGateway]:
    """Start the gateway on cfg's host/port (0 = ephemeral) and stop it on exit."""
    runtime = Runtime(cfg)
    sock = bind(cfg.server.host, cfg.server.port)
    host, port = sock.getsockname()[:2]
    try:
        async with started(runtime) as grpc_front:
            server = HttpServer(runtime, log_level, own_signals=False)
            task = asyncio.create_task(server.serve(sockets=[sock]))
            try:
                while not server.started:
                    if task.done():
                        task.result()  # surfaces the start-up error
                        raise RuntimeError("gateway exited during start-up")
                    await asyncio.sleep(0.01)
                yield RunningGateway(f"http://{host}:{port}", runtime, server, grpc_front)
            finally:
                server.should_exit = True
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(task, timeout=cfg.server.drain_timeout_s + 5)
    finally:
        sock.close()
