"""Child processes of the benchmarks: a readiness probe and a stop that cannot hang."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

STOP_TIMEOUT_S = 10.0


async def http_status(
    host: str, port: int, path: str, headers: Mapping[str, str] | None = None
) -> int:
    """Status of one plain GET (0 if the answer is not HTTP/1.x); no client library needed."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"GET {path} HTTP/1.1\r\nhost: {host}\r\n{extra}connection: close\r\n\r\n".encode()
        )
        line = await reader.readline()
        return int(line.split()[1]) if line.startswith(b"HTTP/1.") else 0
    finally:
        writer.close()


async def stop_process(
    proc: asyncio.subprocess.Process | None, timeout_s: float = STOP_TIMEOUT_S
) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; no-op once it has."""
    if proc is None or proc.returncode is not None:
        return
    proc.terminate()
    try:
        async with asyncio.timeout(timeout_s):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, theirs, ...), from /proc."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out
