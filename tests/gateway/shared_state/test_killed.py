"""A real gateway process SIGKILLed mid-stream: its client sees an error, the others' view heals."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

from simulator import SimFleet
from tests.gateway.conftest import eventually, in_process, set_faults
from tests.gateway.shared_state.conftest import shared_config
from tests.gateway.shared_state.helpers import chat
from tests.redis_server import RedisServer

LEASE = 1.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _toml(fleet: SimFleet, redis: RedisServer, port: int) -> str:
    replicas = "".join(
        f'[[replicas]]\nurl = "{r.url}"\nname = "{r.name}"\n\n' for r in fleet.replicas
    )
    return (
        f"[server]\nport = {port}\n\n[health_check]\ninterval_s = 5.0\n\n"
        f'[shared_state]\nurl = "{redis.url}"\nlease_ttl_s = {LEASE}\n\n{replicas}'
    )


async def _ready(url: str, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30.0
    async with httpx.AsyncClient(timeout=1.0) as c:
        while True:
            assert proc.returncode is None, "the gateway exited"
            try:
                if (await c.get(url + "/ready")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway never became ready"
            await asyncio.sleep(0.05)


async def _stream(url: str, body: dict[str, object]) -> str:
    """Read a stream to its end: 'done', or the error that ended it."""
    async with httpx.AsyncClient(timeout=10.0) as c:
        try:
            async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    pass
            return "done"
        except httpx.TransportError as exc:
            return type(exc).__name__


async def test_killed_process_its_clients_error_and_its_lease_expires(
    fleet4: SimFleet, redis_server: RedisServer, tmp_path: Path
) -> None:
    for r in fleet4.replicas:
        await set_faults(r.url, stall_after_tokens=1, stall_seconds=8.0)
    port = _port()
    config = tmp_path / "gateway.toml"
    config.write_text(_toml(fleet4, redis_server, port))
    cli = Path(sys.executable).with_name("llm-gateway")
    proc = await asyncio.create_subprocess_exec(
        str(cli), "serve", "-c", str(config), stderr=asyncio.subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}"
        await _ready(url, proc)
        async with in_process(shared_config(fleet4, redis_server, lease_ttl_s=LEASE)) as b:
            body = {**chat("long", 1), "stream": True}
            streams = [asyncio.create_task(_stream(url, body)) for _ in range(2)]
            pool = b.runtime.pool
            await eventually(lambda: sum(r.remote_in_flight for r in pool) == 2, timeout=10)
            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            # Its clients see the connection end, well before the replicas' 8 s stall is over.
            ends = await asyncio.wait_for(asyncio.gather(*streams), timeout=5.0)
            assert all(e != "done" for e in ends), ends
            await eventually(lambda: sum(r.remote_in_flight for r in pool) == 0, timeout=LEASE + 2)
            assert time.monotonic() - killed < LEASE + 0.5
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), timeout=10)
