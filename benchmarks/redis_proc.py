"""A real redis-server for a benchmark run: loopback, a free port, a temp dir, no persistence."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import time

from benchmarks import system_deps
from benchmarks.procs import stop_process

_START_TIMEOUT_S = 10.0


class RedisProcessError(RuntimeError):
    """redis-server is missing or did not answer PING in time."""


class RedisProcess:
    """`async with RedisProcess() as r:` r.url is redis://127.0.0.1:<port>/0 until exit."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        exe = system_deps.which("redis-server")
        if exe is None:
            raise RedisProcessError(
                "redis-server is missing: run python -m benchmarks.vllm_cpu prepare"
            )
        self._tmp = tempfile.TemporaryDirectory(prefix="llmgw-redis-")
        with socket.socket() as s:
            s.bind((self.host, 0))
            self.port = int(s.getsockname()[1])
        self._proc = await asyncio.create_subprocess_exec(
            exe,
            "--bind", self.host, "--port", str(self.port), "--dir", self._tmp.name,
            "--save", "", "--appendonly", "no", "--protected-mode", "no",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                break
            if await self._ping():
                return
            await asyncio.sleep(0.05)  # polling readiness under a deadline
        await self.stop()
        raise RedisProcessError(f"redis-server did not answer PING within {_START_TIMEOUT_S:g} s")

    async def _ping(self) -> bool:
        try:
            async with asyncio.timeout(1.0):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                try:
                    writer.write(b"PING\r\n")
                    return (await reader.readline()).startswith(b"+PONG")
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return False

    async def stop(self) -> None:
        await stop_process(self._proc)
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> RedisProcess:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()
