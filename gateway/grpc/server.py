"""The grpc.aio server of the gRPC front end: Inference, health and reflection on one port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway.grpc.config import GrpcConfig
from gateway.grpc.gen import gateway_pb2_grpc as pb_grpc
from gateway.grpc.service import SERVICE_NAME, InferenceService
from gateway.runtime import Runtime

log = logging.getLogger("llm_gateway.grpc")

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GrpcFrontEnd:
    """Serves gRPC in the running event loop on the runtime the HTTP front end also uses."""

    def __init__(self, runtime: Runtime, config: GrpcConfig) -> None:
        self.runtime = runtime
        self.config = config
        self.port = 0
        self.health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind, start serving and return the bound port (config port 0 = ephemeral)."""
        cfg = self.config
        options = cfg.server_options()
        if self.runtime.worker_count > 1:
            # The workers of one gateway share the port (the supervisor reserved it): the
            # kernel spreads connections among them as it does for the HTTP listener.
            options = [(k, 1 if k == "grpc.so_reuseport" else v) for k, v in options]
        server = grpc.aio.server(
            options=options,
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs or None,
        )
        service = InferenceService(self.runtime)
        pb_grpc.add_InferenceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        try:
            self.port = server.add_insecure_port(cfg.address)
        except RuntimeError as exc:  # grpc reports a failed bind this way, without the reason
            raise OSError(f"gRPC cannot listen on {cfg.address}: {exc}") from None
        await self._publish(self._ready())
        await server.start()
        self._server = server
        self._watcher = asyncio.create_task(self._watch_readiness())
        log.info("gRPC front end on %s:%d", cfg.host, self.port)
        return self.port

    async def stop(self, grace_s: float) -> None:
        """Fail health checks, refuse new calls, give open ones grace_s, then cancel them."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self.health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    def _ready(self) -> bool:
        return not self.runtime.draining and self.runtime.pool.ready()

    async def _publish(self, ready: bool) -> None:
        status = _SERVING if ready else _NOT_SERVING
        # "" is the whole server, as load balancers and grpc_health_probe ask by default.
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_readiness(self) -> None:
        ready = self._ready()
        while True:
            await asyncio.sleep(self.config.health_poll_interval_s)
            now = self._ready()
            if now != ready:
                ready = now
                log.info("gRPC health: %s", "SERVING" if ready else "NOT_SERVING")
                await self._publish(ready)


@contextlib.asynccontextmanager
async def running_grpc(
    runtime: Runtime, config: GrpcConfig, grace_s: float = 5.0
) -> AsyncIterator[GrpcFrontEnd]:
    """A gRPC front end on a started runtime for the duration of the block (tests, demo)."""
    front = GrpcFrontEnd(runtime, config)
    await front.start()
    try:
        yield front
    finally:
        await front.stop(grace_s)
