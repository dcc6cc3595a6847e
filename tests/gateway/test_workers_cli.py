"""`llm-gateway serve --workers 2` and `demo --workers 2` as a user runs them: real processes.

The supervisor is the command's own process here: its signals, and its death, are the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from simulator import SimFleet
from tests.gateway.conftest import SIM, STORY, eventually
from tests.gateway.test_workers import _chat, _fresh, _scrape


@dataclass
class _Served:
    """`llm-gateway serve --workers 2` as a subprocess, its stderr read line by line."""

    proc: asyncio.subprocess.Process
    url: str
    log: list[str]
    reader: asyncio.Task[None]

    async def worker_pids(self) -> list[int]:
        samples = await _scrape(self.url)
        return [int(labels["pid"]) for s, labels, _ in samples if s == "llm_gateway_worker_info"]

    def count(self, text: str) -> int:
        return sum(text in line for line in self.log)


@contextlib.asynccontextmanager
async def _served(fleet: SimFleet, tmp_path: Path) -> AsyncIterator[_Served]:
    replicas = "\n".join(
        f'[[replicas]]\nurl = "{r.url}"\nname = "{r.name}"\n' for r in fleet.replicas
    )
    config = tmp_path / "gw.toml"
    config.write_text(f"[server]\nport = 0\ndrain_timeout_s = 20.0\nworkers = 2\n\n{replicas}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "-c", str(config),
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stderr is not None
    stderr = proc.stderr
    log: list[str] = []
    serving = asyncio.Event()

    async def read() -> None:
        # To its end, which comes once the supervisor and every worker are gone.
        while line := (await stderr.readline()).decode():
            log.append(line)
            if re.search(r"2 workers serving http://", line):
                serving.set()

    reader = asyncio.create_task(read())
    pids: list[int] = []
    try:
        await asyncio.wait_for(serving.wait(), 30)
        url = re.findall(r"serving (http://\S+)", "".join(log))[0]
        served = _Served(proc, url, log, reader)
        pids = await served.worker_pids()
        yield served
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in pids:  # only after a failure: the orphans of a killed supervisor
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(reader, 15)


async def test_sigterm_lets_a_running_stream_finish_then_the_supervisor_exits_0(
    tmp_path: Path,
) -> None:
    async with (
        SimFleet(replace(SIM, time_scale=1.0), replicas=1) as fleet,
        _served(fleet, tmp_path) as gw,
    ):
        body = {**STORY, "max_tokens": 150, "ignore_eos": True, "stream": True}
        async with _fresh() as c, c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
            chunks = r.aiter_text()
            text = await anext(chunks)
            gw.proc.send_signal(signal.SIGTERM)
            async for chunk in chunks:
                text += chunk
        assert text.endswith("data: [DONE]\n\n")
        assert await asyncio.wait_for(gw.proc.wait(), 30) == 0
        await asyncio.wait_for(gw.reader, 15)
        # Passed on to both workers, each drained as a single process does.
        assert gw.count("draining: streams get 20 s") == 2, gw.log


def _channel_dir(worker_pid: int) -> Path:
    """The supervisor's private directory: its worker's first argument."""
    return Path(Path(f"/proc/{worker_pid}/cmdline").read_bytes().split(b"\0")[3].decode())


async def test_workers_drain_and_exit_when_the_supervisor_is_killed(
    fleet: SimFleet, tmp_path: Path
) -> None:
    async with _served(fleet, tmp_path) as gw:
        channel = _channel_dir((await gw.worker_pids())[0])
        assert channel.is_dir()
        gw.proc.kill()
        await gw.proc.wait()
        await asyncio.wait_for(gw.reader, 15)  # every worker closed its stderr: gone
        assert gw.count("the supervisor is gone: draining") == 2, gw.log
        assert not channel.exists()  # removed by the last worker out
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])), timeout=2)


async def test_sighup_reloads_every_worker_and_a_restarted_one_too(
    fleet: SimFleet, tmp_path: Path
) -> None:
    async with _served(fleet, tmp_path) as gw:
        gw.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: gw.count("reload done") == 2, 10, "both workers' reloads")
        victim = (await gw.worker_pids())[0]
        os.kill(victim, signal.SIGKILL)
        await eventually(lambda: gw.count("reload done") == 3, 15, "the restarted one's")
        assert gw.proc.returncode is None and await _chat(gw.url, 6) == [200] * 6
        assert victim not in await gw.worker_pids()
        gw.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(gw.proc.wait(), 30) == 0


@pytest.fixture
async def demo() -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "demo", "--port", "0", "--grpc-port", "0",
        "--replicas", "2", "--workers", "2", stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_demo_with_two_workers_serves_and_stops_on_sigterm(
    demo: asyncio.subprocess.Process,
) -> None:
    assert demo.stdout is not None
    url = ""
    while not url:
        line = (await asyncio.wait_for(demo.stdout.readline(), 30)).decode()
        assert line, "demo exited before printing its URL"
        if line.startswith("llm-gateway demo: "):
            url = line.split()[2]
    assert await _chat(url, 6) == [200] * 6
    demo.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(demo.wait(), 30) == 0
