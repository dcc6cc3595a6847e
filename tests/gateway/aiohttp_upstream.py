"""A tiny aiohttp upstream on a real 127.0.0.1 socket: any app, or a replica's few routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on an ephemeral port; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _health(_: web.Request) -> web.Response:
    return web.Response()


async def _models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


def replica_app(chat: Handler) -> web.Application:
    """A replica as the gateway sees it: `chat` answers completions, health and models pass."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    return app
