"""A real OTLP/HTTP trace collector on 127.0.0.1: the `collector` fixture of the tracing tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@pytest.fixture
async def collector() -> AsyncIterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """(the collector's /v1/traces URL, every export request it received)."""
    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(await request.read())
        received.append(msg)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", received
    finally:
        await runner.cleanup()
