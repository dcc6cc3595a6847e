"""A draining gateway and its realtime sessions, over sockets: new ones refused, open ones kept
until they end or the drain period does, then closed with 1012 (service restart)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import connect

from gateway.config import ServerConfig
from simulator import SimFleet
from simulator.realtime import open_sessions
from tests.gateway.conftest import eventually
from tests.gateway.http.test_drain import _serve as serve
from tests.gateway.http.test_realtime import (
    AUTH,
    KEY,
    RT,
    RT_MODEL,
    close_code,
    recv,
    refused,
    rig,
    transcribe,
)
from tests.gateway.http.test_realtime_pipeline import connect_with_key, queueing
from tests.gateway.http.test_realtime_pipeline import rig as version_rig


async def test_a_draining_gateway_refuses_new_sessions_and_keeps_open_ones() -> None:
    async with rig(drain_timeout_s=1.0) as r:
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
            r.gw.runtime.begin_drain(asyncio.get_running_loop())
            status, body = await refused(r.url, additional_headers=AUTH)
            assert status == 503
            assert body["error"] == {
                "message": "The gateway is shutting down.",
                "type": "ServiceUnavailableError",
                "param": None,
                "code": 503,
            }
            # The open session goes on within the drain period...
            deltas, _ = await transcribe(ws)
            assert len(deltas) == 6
            # ...and is closed with "service restart" when it ends.
            async with asyncio.timeout(5.0):
                assert await close_code(ws) == 1012
        await eventually(lambda: open_sessions(r.rt.replicas[0]) == 0, what="replica closed")
        await eventually(lambda: r.in_flight()["rt-0"] == 0, what="lease released")
        assert r.outcomes()[(RT_MODEL, "drained")] == 1


async def test_sigterm_keeps_open_sessions_until_the_drain_period_ends() -> None:
    async with version_rig(server=ServerConfig(port=0, api_keys=(KEY,), drain_timeout_s=1.0)) as r:
        replica = r.fleets[0].replicas[0]
        ws = await connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH)
        await recv(ws)
        # One session still waiting for its session.update: open too, so kept as well.
        waiting = await connect(r.url, additional_headers=AUTH)
        await recv(waiting)
        await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        server = r.gw.server
        server.handle_exit(signal.SIGTERM, None)
        await eventually(lambda: not server.servers or not server.servers[0].is_serving())
        # uvicorn alone would close both now with 1012: they stay open and working.
        deltas, _ = await transcribe(ws)
        assert len(deltas) == 6
        await waiting.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        again, _ = await transcribe(waiting)
        assert again == deltas
        async with asyncio.timeout(5.0):
            assert await close_code(ws) == 1012
            assert await close_code(waiting) == 1012
        await eventually(lambda: open_sessions(replica) == 0, what="replica sockets closed")
        assert r.in_flight() == {"rt-0": 0}


async def test_a_session_that_ends_first_lets_the_gateway_stop_before_the_deadline() -> None:
    async with version_rig(server=ServerConfig(port=0, api_keys=(KEY,), drain_timeout_s=20.0)) as r:
        ws = await connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH)
        await recv(ws)
        server = r.gw.server
        server.handle_exit(signal.SIGTERM, None)
        await eventually(lambda: not server.servers or not server.servers[0].is_serving())
        loop = asyncio.get_running_loop()
        closed_at = loop.time()
        await ws.close()
        # No session left: uvicorn's shutdown ends well before the 20 s drain period.
        await eventually(lambda: not server.server_state.connections, timeout=3.0)
        assert loop.time() - closed_at < 3.0


async def test_sessions_still_queued_when_the_drain_period_ends_are_turned_away() -> None:
    server = ServerConfig(port=0, api_keys=(KEY,), drain_timeout_s=0.5)
    async with version_rig(server=server, **queueing()) as r:
        first = await connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH)
        await recv(first)
        upgrading = asyncio.create_task(connect_with_key(r.url + f"?model={RT_MODEL}"))
        inband = await connect(r.url, additional_headers=AUTH)
        await recv(inband)
        await inband.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        await eventually(lambda: r.queued() == 2, what="both queued")
        r.gw.runtime.begin_drain(asyncio.get_running_loop())
        async with asyncio.timeout(5.0):
            with pytest.raises(websockets.InvalidStatus) as caught:
                await upgrading
            assert caught.value.response.status_code == 503
            assert await close_code(inband) == 1012
            assert await close_code(first) == 1012
        assert r.queued() == 0
        await eventually(lambda: r.in_flight() == {"rt-0": 0}, what="lease released")


def _accepting(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except OSError:
        return False
    return True


async def test_sigterm_on_serve_drains_a_realtime_session(tmp_path: Path) -> None:
    async with SimFleet(RT, replicas=1, host="127.0.0.1", base_port=0) as fleet:
        proc, url = await serve(fleet, tmp_path, 1.0)
        try:
            ws_url = url.replace("http://", "ws://") + f"/v1/realtime?model={RT_MODEL}"
            async with connect(ws_url) as ws:
                await recv(ws)
                await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
                proc.send_signal(signal.SIGTERM)
                await eventually(lambda: not _accepting(url), what="listener closed")
                deltas, _ = await transcribe(ws)  # uvicorn alone: closed at once with 1012
                assert len(deltas) == 6
                async with asyncio.timeout(10.0):
                    assert await close_code(ws) == 1012
            assert await asyncio.wait_for(proc.wait(), timeout=15.0) == 0
            await eventually(lambda: open_sessions(fleet.replicas[0]) == 0, what="closed")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
