"""A bare pass-through proxy (no routing, no features): one server, the product's upstream client.

Run as `python -m gateway.cli --log-level L serve -c CFG` from a tree whose gateway/cli.py is
this file, so the wrk harness (`bench overhead --harness wrk --gateway NAME=DIR`) measures it
like a gateway build. BARE_SERVER = uvicorn | granian | aiohttp.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tomllib

import uvloop

from gateway.config import UpstreamConfig
from gateway.proxy.http_client import Http1Client

SERVER = os.environ.get("BARE_SERVER", "uvicorn")  # each tree's copy names its server


def _config() -> tuple[str, int, str]:
    with open(sys.argv[sys.argv.index("-c") + 1], "rb") as f:
        cfg = tomllib.load(f)
    return cfg["server"]["host"], cfg["server"]["port"], cfg["replicas"][0]["url"]


HOST, PORT, UPSTREAM = _config()
URL = UPSTREAM + "/v1/chat/completions"
HEADERS = {"content-type": "application/json"}
client = Http1Client(UpstreamConfig())


async def asgi(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})
        return
    chunks = []
    while True:
        m = await receive()
        chunks.append(m.get("body", b""))
        if not m.get("more_body"):
            break
    async with asyncio.timeout(30):
        resp = await client.post(URL, b"".join(chunks), HEADERS)
    headers = [(k, v) for k, v in resp.headers.raw if k in (b"content-type", b"content-length")]
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    while True:
        async with asyncio.timeout(30):
            data = await resp.readany()
        if not data:
            break
        await send({"type": "http.response.body", "body": data, "more_body": True})
    resp.release()
    await send({"type": "http.response.body", "body": b""})


async def aiohttp_main() -> None:
    from aiohttp import web

    async def ready(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with asyncio.timeout(30):
            resp = await client.post(URL, body, HEADERS)
        out = web.StreamResponse(status=resp.status)
        for k, v in resp.headers.raw:
            if k in (b"content-type", b"content-length"):
                out.headers[k.decode()] = v.decode()
        await out.prepare(request)
        while True:
            async with asyncio.timeout(30):
                data = await resp.readany()
            if not data:
                break
            await out.write(data)
        resp.release()
        await out.write_eof()
        return out

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, PORT).start()
    await asyncio.Event().wait()


async def main() -> None:
    if SERVER == "uvicorn":
        import uvicorn

        cfg = uvicorn.Config(
            asgi,
            host=HOST,
            port=PORT,
            loop="uvloop",
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
        )
        await uvicorn.Server(cfg).serve()
    elif SERVER == "granian":
        from granian.constants import Interfaces
        from granian.server.embed import Server

        await Server(
            asgi,
            address=HOST,
            port=PORT,
            interface=Interfaces.ASGI,
            log_enabled=False,
            websockets=False,
        ).serve()
    else:
        await aiohttp_main()


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(main())
