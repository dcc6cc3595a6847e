"""The protocol's disconnect hook: the app learns of a gone client without a watcher task."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn

from gateway.config import ServerConfig
from gateway.http.protocol import guarded_protocol
from gateway.http.transport import DISCONNECT_EXTENSION, DisconnectHook

WAIT_S = 5.0
_POST = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"


class _App:
    """Registers a callback on the hook; answers at once or holds the request until told."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.fired = 0
        self.hooks: list[DisconnectHook | None] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        hook = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
        self.hooks.append(hook)
        if hook is not None:
            hook.callback = self._fire
        await receive()  # the body
        if not self.answer:
            await self.release.wait()
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def _fire(self) -> None:
        self.fired += 1
        self.release.set()


@contextlib.asynccontextmanager
async def _server(app: _App) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=guarded_protocol(ServerConfig()), lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await _until(lambda: server.started)
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)


async def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)  # polling a condition under a deadline


async def test_a_client_gone_mid_request_fires_the_hook_once() -> None:
    app = _App(answer=False)
    async with _server(app) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_POST)
        await _until(lambda: len(app.hooks) == 1)
        writer.close()
        await _until(lambda: app.fired == 1)
    assert isinstance(app.hooks[0], DisconnectHook)
    assert app.fired == 1


async def test_a_close_after_the_response_does_not_fire_it() -> None:
    app = _App(answer=True)
    async with _server(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # a fresh hook for each request on a kept-alive connection
            writer.write(_POST)
            await asyncio.wait_for(reader.readuntil(b"ok"), WAIT_S)
        writer.close()
        await writer.wait_closed()
        await _until(lambda: len(app.hooks) == 2)
    assert app.hooks[0] is not app.hooks[1]
    assert app.fired == 0


async def test_a_request_refused_mid_body_fires_it() -> None:
    app = _App(answer=False)
    async with _server(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # A malformed chunked body: the protocol answers 400 itself while the app holds it.
        writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n")
        await _until(lambda: len(app.hooks) == 1)
        writer.write(b"zz\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S)
        await _until(lambda: app.fired == 1)
        writer.close()
    assert head.startswith(b"HTTP/1.1 400")


async def test_the_hook_says_when_the_whole_body_is_buffered() -> None:
    seen: list[bool] = []

    class _BodyApp(_App):
        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            hook = scope["extensions"][DISCONNECT_EXTENSION]
            seen.append(hook.body_buffered)
            while (await receive()).get("more_body"):
                pass
            seen.append(hook.body_buffered)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    app = _BodyApp(answer=True)
    async with _server(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_POST)  # head and body in one write
        await asyncio.wait_for(reader.readuntil(b"ok"), WAIT_S)
        writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\n\r\n")
        await _until(lambda: len(seen) == 3)
        writer.write(b"{}{}")
        await asyncio.wait_for(reader.readuntil(b"ok"), WAIT_S)
        writer.close()
    assert seen == [True, True, False, True]
