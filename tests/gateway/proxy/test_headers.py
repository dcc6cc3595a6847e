"""Headers across the gateway, in-process, checked by a recording upstream on a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.config import GatewayConfig, ReplicaConfig, ServerConfig, UpstreamConfig
from tests.gateway.conftest import in_process


@pytest.fixture
async def recording_upstream() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response(
            {"id": "chatcmpl-1", "choices": []},
            headers={"Keep-Alive": "timeout=5", "Proxy-Connection": "x", "X-Upstream": "1"},
        )

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_hop_by_hop_and_credentials(
    recording_upstream: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = recording_upstream
    cfg = GatewayConfig(
        server=ServerConfig(port=0),
        upstream=UpstreamConfig(api_key="upstream-key"),
        replicas=(ReplicaConfig(url=url, name="rec", models=("m",)),),
    )
    async with in_process(cfg) as gw:
        r = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={
                "Authorization": "Bearer client-secret",
                "Connection": "keep-alive, X-Drop-Me",
                "X-Drop-Me": "1",
                "Keep-Alive": "timeout=9",
                "TE": "trailers",
                "X-Request-Id": "rid-7",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            },
        )
        assert r.status_code == 200
        up = seen[-1]
        assert up["authorization"] == "Bearer upstream-key"
        assert "client-secret" not in str(up)
        for hop in ("x-drop-me", "keep-alive", "te", "proxy-connection"):
            assert hop not in up, hop
        assert up["x-request-id"] == "rid-7"
        assert up["traceparent"].startswith("00-0af7651916cd43dd")
        # Back to the client: upstream hop-by-hop headers are gone, the rest and the id remain.
        assert r.headers["x-upstream"] == "1"
        assert "proxy-connection" not in r.headers and "keep-alive" not in r.headers
        assert r.headers["x-request-id"] == "rid-7"
