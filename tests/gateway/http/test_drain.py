"""SIGTERM on `llm-gateway serve`: stop accepting, let streams finish within the grace period."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, eventually


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(
    fleet: SimFleet, tmp_path: Path, drain_s: float
) -> tuple[asyncio.subprocess.Process, str]:
    port = _free_port()
    replicas = "\n".join(
        f'[[replicas]]\nurl = "{r.url}"\nname = "{r.name}"\n' for r in fleet.replicas
    )
    config = tmp_path / "gw.toml"
    config.write_text(f"[server]\nport = {port}\ndrain_timeout_s = {drain_s}\n\n{replicas}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--log-level", "warning", "serve", "-c", str(config),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient() as c:
        while True:
            try:
                if (await c.get(url + "/ready")).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
            assert proc.returncode is None, "gateway exited during start-up"
            assert time.monotonic() < deadline, "gateway never became ready"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("drain_s", "tokens", "completes"), [(20.0, 150, True), (0.5, 5000, False)]
)
async def test_sigterm_drains_streams(
    tmp_path: Path, drain_s: float, tokens: int, completes: bool
) -> None:
    from dataclasses import replace

    # Real-time clock: ~10 ms per token, so the stream is still running when SIGTERM lands.
    async with SimFleet(replace(SIM, time_scale=1.0), replicas=1) as fleet:
        proc, url = await _serve(fleet, tmp_path, drain_s)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "long answer please"}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            async with (
                httpx.AsyncClient(timeout=60) as c,
                c.stream("POST", url + "/v1/chat/completions", json=body) as r,
            ):
                chunks = r.aiter_raw()
                received = [await anext(chunks)]
                proc.send_signal(signal.SIGTERM)

                # New connections are refused at once (readiness fails), the open stream goes on.
                async def refused() -> bool:
                    try:
                        # Closed each time: a probe that still got in must not leak its socket.
                        async with httpx.AsyncClient() as probe:
                            await probe.get(url + "/health")
                    except httpx.TransportError:
                        return True
                    return False

                for _ in range(200):
                    if await refused():
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("gateway still accepting after SIGTERM")
                # Past the grace period the gateway ends the stream itself, cleanly, with
                # vLLM's error event and no [DONE]: never a bare connection reset.
                async for chunk in chunks:
                    received.append(chunk)
            raw = b"".join(received)
            assert raw.endswith(b"data: [DONE]\n\n") is completes
            if not completes:
                assert raw.rstrip().rsplit(b"\n\n", 1)[-1].startswith(b'data: {"error"')
                assert b'"code":503' in raw
            assert await asyncio.wait_for(proc.wait(), timeout=drain_s + 15) == 0
            # Whatever was cut, the replica's slot is free again.
            await eventually(lambda: fleet.replicas[0].engine.num_running == 0, timeout=2.0)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
