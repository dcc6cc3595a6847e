"""The overhead benchmark's processes (static upstream, gateway, peer routers) and their CPU."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from benchmarks.procs import http_status, stop_process
from benchmarks.routing_bench.contenders import ContenderUnavailable, FleetInfo
from benchmarks.routing_bench.peers import PeerContender, peer_contenders
from benchmarks.static_upstream import MODEL

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_REPO = Path(__file__).resolve().parents[1]
_START_TIMEOUT_S = 20.0
_VERSIONED = (
    "uvloop",
    "uvicorn",
    "httptools",
    "starlette",
    "aiohttp",
    "orjson",
    "grpcio",
    "protobuf",
)


class BenchProcessError(Exception):
    """A benchmark process failed to start or exited early."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc/<pid>/stat (clock-tick units)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # The command name may contain spaces: fields are counted after its closing parenthesis.
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def cpu_seconds_of(pids: Sequence[int]) -> float:
    """CPU seconds so far of the processes that still exist among `pids`."""
    total = 0.0
    for pid in pids:
        # One that exited since it was listed took its time with it.
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def runqueue_wait_s(pids: Sequence[int]) -> float:
    """Seconds the threads of `pids` have spent runnable but not running (schedstat's wait).

    Summed over every thread: a multi-threaded router's other threads run on while one waits,
    a single event loop does not, so the figure says how much of a tail the cores' contention
    explains. 0 where the kernel keeps no schedstat.
    """
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                path = Path(f"/proc/{pid}/task/{task}/schedstat")
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += int(path.read_text().split()[1])
    return total / 1e9


def child_env() -> dict[str, str]:
    """This environment with the repository importable (for `python -m` children)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    return env


def free_ports(host: str, n: int) -> list[int]:
    """n distinct free TCP ports on `host`."""
    # All bound at once, so that the n ports differ.
    with contextlib.ExitStack() as stack:
        socks = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)
        ]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


# benchmarks/faults/procs.py imports the old name.
_free_ports = free_ports


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


@dataclass
class _Child:
    name: str
    proc: asyncio.subprocess.Process
    log: Path

    def check_alive(self) -> None:
        if self.proc.returncode is not None:
            raise BenchProcessError(
                f"{self.name} exited with {self.proc.returncode}: {_tail(self.log)}"
            )

    async def stop(self) -> None:
        await stop_process(self.proc)


async def _wait_ready(child: _Child, host: str, port: int, path: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        child.check_alive()
        try:
            async with asyncio.timeout(1.0):
                status = await http_status(host, port, path)
            if status == 200:
                return
            last = f"HTTP {status}"
        except (OSError, TimeoutError, ValueError, IndexError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.05)  # polling a readiness condition, under a deadline
    raise BenchProcessError(f"{child.name} not ready on {path} ({last}): {_tail(child.log)}")


async def wait_ready(
    name: str, proc: asyncio.subprocess.Process, log: Path, host: str, port: int, path: str
) -> None:
    """Poll GET `path` until it answers 200 (BenchProcessError if `proc` exits or never does)."""
    await _wait_ready(_Child(name, proc, log), host, port, path)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The running upstream and gateway: where to reach them and their process ids."""

    host: str
    upstream_port: int
    gateway_port: int
    grpc_port: int
    upstream_pid: int
    gateway_pid: int

    def cpu_snapshot(self) -> dict[str, float]:
        """CPU seconds so far of the gateway, the upstream and this (load generator) process."""
        return {
            "gateway": cpu_seconds(self.gateway_pid),
            "upstream": cpu_seconds(self.upstream_pid),
            "loadgen": time.process_time(),
        }


def _gateway_toml(host: str, port: int, grpc_port: int, upstream_url: str) -> str:
    # Defaults everywhere else (routing profile, metrics on): the gateway as it ships, plus
    # its gRPC front end, which HTTP rows then also pay for while it idles.
    return (
        f'[server]\nhost = "{host}"\nport = {port}\ndrain_timeout_s = 2.0\n\n'
        f'[grpc]\nenabled = true\nhost = "{host}"\nport = {grpc_port}\n\n'
        f'[[replicas]]\nurl = "{upstream_url}"\nname = "static"\n'
    )


async def _spawn(args: list[str], log: IO[bytes], stdout: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", *args, stdout=stdout, stderr=log, env=child_env(), cwd=_REPO
    )


async def _spawn_in(src: Path, args: list[str], log: IO[bytes]) -> asyncio.subprocess.Process:
    """`python -m args` run from the source tree `src` (another build of the gateway)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", *args, stdout=asyncio.subprocess.DEVNULL, stderr=log, env=env, cwd=src
    )


@contextlib.asynccontextmanager
async def fleet(host: str, chunks: int, gap_ms: float = 0.0) -> AsyncIterator[Fleet]:
    """Start the static upstream, then a gateway (HTTP + gRPC) in front of it; stop both on exit."""
    children: list[_Child] = []
    with tempfile.TemporaryDirectory(prefix="llm-gw-overhead-") as tmp:
        work = Path(tmp)
        try:
            up_log = work / "upstream.log"
            with up_log.open("wb") as log:
                args = ["benchmarks.static_upstream", "--host", host, "--port", "0"]
                args += ["--chunks", str(chunks), "--gap-ms", str(gap_ms)]
                proc = await _spawn(args, log, asyncio.subprocess.PIPE)
            upstream = _Child("static upstream", proc, up_log)
            children.append(upstream)
            assert proc.stdout is not None
            try:
                async with asyncio.timeout(_START_TIMEOUT_S):
                    line = (await proc.stdout.readline()).decode()
                up_port = int(line.rsplit(":", 1)[1])
            except (TimeoutError, ValueError, IndexError):
                raise BenchProcessError(f"static upstream did not start: {_tail(up_log)}") from None
            await _wait_ready(upstream, host, up_port, "/health")

            gw_port, grpc_port = free_ports(host, 2)
            cfg = work / "gateway.toml"
            cfg.write_text(_gateway_toml(host, gw_port, grpc_port, f"http://{host}:{up_port}"))
            gw_log = work / "gateway.log"
            with gw_log.open("wb") as log:
                args = ["gateway.cli", "--log-level", "warning", "serve", "-c", str(cfg)]
                proc = await _spawn(args, log, asyncio.subprocess.DEVNULL)
            gateway = _Child("gateway", proc, gw_log)
            children.append(gateway)
            # The gRPC front end starts before the HTTP one listens: /ready covers both.
            await _wait_ready(gateway, host, gw_port, "/ready")
            yield Fleet(host, up_port, gw_port, grpc_port, upstream.proc.pid, gateway.proc.pid)
            for child in children:
                child.check_alive()
        finally:
            for child in reversed(children):
                await child.stop()


def fleet_info(f: Fleet) -> FleetInfo:
    """The static upstream as a one-replica fleet, for the peer routers."""
    url = f"http://{f.host}:{f.upstream_port}"
    return FleetInfo((url,), MODEL, (None,), None, 16, "static")


@dataclass
class PeerRun:
    """One peer router in this run; `status` is "run", "not run: <why>" or "stopped: <why>"."""

    name: str
    policy: str
    version: str | None
    status: str
    contender: PeerContender | None = None
    host: str = ""
    port: int = 0
    events_per_answer: int | None = None  # SSE events incl. [DONE] it relays per answer

    @property
    def running(self) -> bool:
        return self.status == "run"

    def cpu_seconds(self) -> float:
        """CPU seconds so far of the peer's process(es), as they are now."""
        return cpu_seconds_of(self.contender.pids()) if self.contender else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policy": self.policy,
            "version": self.version,
            "status": self.status,
            "events_per_answer": self.events_per_answer,
        }


def not_run(names: Sequence[str], reason: str) -> list[PeerRun]:
    """The named peers, listed as not run for `reason`."""
    return [PeerRun(c.name, c.policy, c.version(), f"not run: {reason}") for c in _peers(names)]


def _peers(names: Sequence[str]) -> list[PeerContender]:
    by_name = {c.name: c for c in peer_contenders(list(names))}
    return [by_name[n] for n in names]


async def _start_peer(c: PeerContender, info: FleetInfo) -> PeerRun:
    run = PeerRun(c.name, c.policy, c.version(), "run", c)
    try:
        url = urlsplit(await c.start(info))
    except (ContenderUnavailable, OSError) as exc:
        run.status = f"not run: {getattr(exc, 'reason', None) or repr(exc)}"
        run.contender = None
        return run
    run.host, run.port = url.hostname or "", url.port or 0
    return run


@contextlib.asynccontextmanager
async def peer_routers(names: Sequence[str], info: FleetInfo) -> AsyncIterator[list[PeerRun]]:
    """Start the named peers in front of `info` together; those that cannot run say why."""
    contenders = _peers(names)
    try:
        runs = await asyncio.gather(*(_start_peer(c, info) for c in contenders))
        yield list(runs)
    finally:
        # stop() is a no-op for a peer that never started or already stopped.
        for c in contenders:
            await c.stop()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """The machine and software the figures were measured on."""
    versions: dict[str, str] = {}
    for name in _VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "loadavg_at_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }
