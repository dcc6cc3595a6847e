"""The fault suite's processes: one simulated replica per process (so one can be SIGKILLed and
restarted on its port) and one `llm-gateway serve`; their readiness, memory and metrics."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

import aiohttp

from benchmarks.overhead_procs import BenchProcessError, _Child, _free_ports, _tail, child_env
from benchmarks.overhead_procs import _wait_ready as wait_ready
from benchmarks.procs import stop_process
from benchmarks.routing_bench.fleet import SimParams

_REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
_HTTP = aiohttp.ClientTimeout(total=5.0)


class ProcessError(BenchProcessError):
    """A process of the suite was not there when needed (a start that failed raises the
    base class, from the overhead benchmark's readiness probe)."""


def rss_kib(pid: int) -> int:
    """VmRSS of a process, KiB, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ProcessError(f"no VmRSS for pid {pid}")


def free_ports(n: int) -> list[int]:
    """n distinct free ports on HOST."""
    return _free_ports(HOST, n)


async def _wait_ready(
    proc: asyncio.subprocess.Process, port: int, path: str, log: Path, what: str
) -> None:
    await wait_ready(_Child(what, proc, log), HOST, port, path)


async def _spawn(args: Sequence[str], log: IO[bytes]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
        env=child_env(),
        cwd=_REPO,
    )


# The routing benchmark's simulator knobs, with a KV cache no run here fills.
SIM = SimParams(num_gpu_blocks=8192)


def sim_args(sim: SimParams, port: int, index: int) -> list[str]:
    """One replica on `port`, its own seed, no KV events (argparse: the last option wins)."""
    own = replace(sim, replicas=1, seed=sim.seed + index).args()
    return ["-m", "simulator", *own, "--base-port", str(port), "--kv-events", "false"]


class SimReplica:
    """One simulated replica in a process of its own, on a port it keeps across restarts."""

    def __init__(self, index: int, port: int, settings: SimParams, work: Path) -> None:
        self.index = index
        self.name = f"r{index}"
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self._settings = settings
        self._log = work / f"{self.name}.log"
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        p = self._proc
        return p.pid if p is not None and p.returncode is None else None

    async def start(self) -> None:
        with self._log.open("ab") as log:
            self._proc = await _spawn(sim_args(self._settings, self.port, self.index), log)
        await _wait_ready(self._proc, self.port, "/health", self._log, f"replica {self.name}")

    async def kill(self) -> None:
        """SIGKILL: no drain, no goodbye; its connections are reset by the kernel."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            raise ProcessError(f"replica {self.name} is not running")
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()

    async def stop(self) -> None:
        await stop_process(self._proc)


class Gateway:
    """`llm-gateway serve` with a generated TOML, in a child process."""

    def __init__(self, toml: str, port: int, work: Path) -> None:
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.toml = toml
        self._work = work
        self.log = work / "gateway.log"
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        p = self._proc
        if p is None or p.returncode is not None:
            raise ProcessError(f"the gateway is not running: {_tail(self.log)}")
        return p.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        cfg = self._work / "gateway.toml"
        cfg.write_text(self.toml)
        args = ["-m", "gateway.cli", "--log-level", "warning", "serve", "-c", str(cfg)]
        with self.log.open("wb") as log:
            self._proc = await _spawn(args, log)
        await _wait_ready(self._proc, self.port, "/ready", self.log, "the gateway")

    async def stop(self) -> None:
        await stop_process(self._proc)


async def set_faults(session: aiohttp.ClientSession, url: str, patch: Mapping[str, object]) -> None:
    """POST /_sim/faults on one replica."""
    async with session.post(url + "/_sim/faults", json=dict(patch), timeout=_HTTP) as r:
        if r.status != 200:
            raise ProcessError(f"{url}/_sim/faults answered {r.status}: {await r.text()}")


async def engine_restart(session: aiohttp.ClientSession, url: str) -> None:
    """POST /_sim/restart: the engine drops every request and its cache, as a vLLM restart."""
    async with session.post(url + "/_sim/restart", timeout=_HTTP) as r:
        if r.status != 200:
            raise ProcessError(f"{url}/_sim/restart answered {r.status}")


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text: each sample name's sum over its label sets (and `name{k="v"}` too)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        name = head.split("{", 1)[0]
        sums[name] = sums.get(name, 0.0) + number
        if "{" in head:
            sums[head] = sums.get(head, 0.0) + number
    return sums


async def gateway_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics", timeout=_HTTP) as r:
        if r.status != 200:
            raise ProcessError(f"{url}/metrics answered {r.status}")
        return metric_sums(await r.text())


def by_label(sums: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    """`name`'s samples summed by one label's value (from metric_sums' labelled keys)."""
    out: dict[str, float] = {}
    pattern = re.compile(re.escape(name) + r"\{(?:.*,)?" + re.escape(label) + r'="([^"]*)"')
    for head, value in sums.items():
        m = pattern.match(head)
        if m is not None:
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out
