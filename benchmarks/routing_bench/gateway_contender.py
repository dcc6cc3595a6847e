"""Our gateway as a contender: `python -m gateway.cli serve` in a child process, one per profile."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from benchmarks.procs import descendants, http_status, stop_process
from benchmarks.redis_proc import RedisProcess, RedisProcessError
from benchmarks.routing_bench.contenders import ContenderUnavailable, FleetInfo
from gateway.logs import REQUEST_LOGGER

_REPO = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class GatewayMode:
    """One gateway contender: the routing profile and how the prefix index is fed.

    precise: replicas' KV events + the replicas' tokenizer (the precise prefix index);
    otherwise no events and no tokenizer (character blocks: the approximate index).
    extra_toml: more TOML appended to the config (e.g. `[routing.profiles.X]` tables).
    workers: gateway processes in all; hosts: over how many listen addresses (127.0.0.1,
    127.0.0.2, ...: "hosts" of workers/hosts processes each, the load spread over them);
    shared_state: the processes share routing state through a real Redis started for them.
    request_log: one JSON record per request in the log, for `placements()`.
    source: another checkout of the gateway the processes run from ("" = this one): two
    builds side by side in one run, the same traffic for both.
    """

    label: str
    profile: str
    precise: bool = False
    extra_toml: str = ""
    workers: int = 1
    hosts: int = 1
    shared_state: bool = False
    request_log: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.workers < self.hosts or self.workers % self.hosts:
            raise ValueError(
                f"{self.label}: workers ({self.workers}) must be a multiple of hosts ({self.hosts})"
            )


BUILTIN_MODES: tuple[GatewayMode, ...] = (
    GatewayMode("round_robin", "round_robin"),
    GatewayMode("least_load", "least_load"),
    GatewayMode("session", "session"),
    GatewayMode("prefix", "prefix"),
    GatewayMode("precise", "prefix", precise=True),
    GatewayMode("default", "default"),
)


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gateway_toml(
    mode: GatewayMode, fleet: FleetInfo, host: str, port: int, redis_url: str = ""
) -> str:
    """The generated configuration; everything not named here keeps its shipped default."""
    lines = [
        "[server]",
        f"host = {_q(host)}",
        f"port = {port}",
        "drain_timeout_s = 2.0",
        "",
        "[routing]",
        f"profile = {_q(mode.profile)}",
        "",
    ]
    extra = mode.extra_toml
    if redis_url:
        # A variant's own [shared_state] table gets the url; else the table is ours.
        header = "[shared_state]\n"
        if header in extra:
            extra = extra.replace(header, f"{header}url = {_q(redis_url)}\n", 1)
        else:
            lines += ["[shared_state]", f"url = {_q(redis_url)}", ""]
    if mode.request_log:
        lines += ["[telemetry]", "request_log = true", 'log_format = "json"', ""]
    if mode.precise:
        lines += [
            "[cache_index]",
            f"tokenizer = {_q(fleet.tokenizer or '')}",
            f"block_size = {fleet.block_size}",
            "",
        ]
    for i, url in enumerate(fleet.urls):
        lines += ["[[replicas]]", f"url = {_q(url)}", f"name = {_q(f'replica-{i}')}"]
        ep = fleet.kv_endpoints[i] if i < len(fleet.kv_endpoints) else None
        if mode.precise:
            lines.append(f"kv_events = {_q(ep or 'auto')}")
        lines.append("")
    return "\n".join(lines) + ("\n" + extra if extra else "")


def _tail(log: Path) -> str:
    """The end of a gateway's log, for the error message (small: read on the loop)."""
    return log.read_text(errors="replace")[-1500:]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class GatewayContender:
    """Starts the gateway with a generated TOML; its log is kept for the error message."""

    def __init__(self, mode: GatewayMode, host: str = "127.0.0.1") -> None:
        self.mode = mode
        self.name = f"gateway:{mode.label}"
        self._host = host
        self._procs: list[asyncio.subprocess.Process] = []
        self._redis: RedisProcess | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def _hosts(self) -> list[str]:
        """One listen address per "host": this one, then the next loopback addresses."""
        if self.mode.hosts == 1:
            return [self._host]
        return [f"127.0.0.{1 + i}" for i in range(self.mode.hosts)]

    async def start(self, fleet: FleetInfo) -> str:
        """Every process ready; several hosts: their URLs joined by commas (the load generator
        spreads requests over them in turn, as a client-side load balancer would)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="llmgw-bench-")
        work = Path(self._tmp.name)
        redis_url = ""
        if self.mode.shared_state:
            self._redis = RedisProcess()
            try:
                await self._redis.start()
            except RedisProcessError as exc:
                await self.stop()
                raise ContenderUnavailable(str(exc)) from None
            redis_url = self._redis.url
        per_host = self.mode.workers // self.mode.hosts
        urls = []
        for i, host in enumerate(self._hosts()):
            port = _free_port(host)
            cfg = work / f"gateway-{i}.toml"
            cfg.write_text(gateway_toml(self.mode, fleet, host, port, redis_url))
            await self._spawn(cfg, work / f"gateway-{i}.log", per_host)
            urls.append(await self._ready(host, port, work / f"gateway-{i}.log"))
        return ",".join(urls)

    async def _spawn(self, cfg: Path, log: Path, workers: int) -> None:
        env = dict(os.environ)
        repo = Path(self.mode.source) if self.mode.source else _REPO
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p)
        level = "info" if self.mode.request_log else "warning"
        argv = [sys.executable, "-m", "gateway.cli", "--log-level", level, "serve"]
        argv += ["-c", str(cfg)] + (["--workers", str(workers)] if workers > 1 else [])
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=err, env=env, cwd=repo
            )
        self._procs.append(proc)

    async def _ready(self, host: str, port: int, log: Path) -> str:
        proc = self._procs[-1]
        deadline = time.monotonic() + _START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = _tail(log)
                await self.stop()
                raise ContenderUnavailable(f"gateway exited ({proc.returncode}): {tail}")
            try:
                async with asyncio.timeout(1.0):
                    code = await http_status(host, port, "/ready")
                if code == 200:
                    return f"http://{host}:{port}"
                last = f"HTTP {code}"
            except (OSError, TimeoutError, ValueError, IndexError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.1)  # polling readiness under a deadline
        tail = _tail(log)
        await self.stop()
        raise ContenderUnavailable(f"gateway not ready in {_START_TIMEOUT_S:g} s ({last}): {tail}")

    async def stop(self) -> None:
        for proc in self._procs:
            await stop_process(proc)
        self._procs = []
        if self._redis is not None:
            await self._redis.stop()
            self._redis = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def placements(self) -> dict[str, str]:
        """Request id -> replica name of every request logged so far (mode.request_log)."""
        out: dict[str, str] = {}
        if self._tmp is None:
            return out
        for log in sorted(Path(self._tmp.name).glob("gateway-*.log")):
            for line in log.read_bytes().splitlines():
                if not line.startswith(b"{"):
                    continue
                with contextlib.suppress(orjson.JSONDecodeError):
                    rec = orjson.loads(line)
                    if rec.get("logger") == REQUEST_LOGGER and rec.get("replica"):
                        out[str(rec["request_id"])] = str(rec["replica"])
        return out

    def pids(self) -> list[int]:
        """Every gateway process (workers included) and the Redis they share."""
        out: list[int] = []
        for p in self._procs:
            if p.returncode is None:
                out += [p.pid, *descendants(p.pid)]
        if self._redis is not None and self._redis.pid is not None:
            out.append(self._redis.pid)
        return out


def same_as_default(profile: str) -> bool:
    """Whether a built-in profile runs exactly the default's tiers, filters, scorers, picker."""
    from routing.profile import BUILTIN_PROFILES

    a, b = BUILTIN_PROFILES[profile], BUILTIN_PROFILES["default"]
    return (a.affinity, a.filters, a.scorers, a.picker) == (
        b.affinity,
        b.filters,
        b.scorers,
        b.picker,
    )


def gateway_contenders(
    labels: list[str] | None = None, extra: tuple[GatewayMode, ...] = ()
) -> list[GatewayContender]:
    """The built-in modes (all, or those named) plus any custom ones, in that order.

    Unnamed, the approximate `prefix` mode is left out while it is the default profile: a
    second run of one profile measures only the machine's noise (and once "won" a target).
    """
    if labels is None:
        modes = [
            m for m in BUILTIN_MODES if not (m.label == "prefix" and same_as_default(m.profile))
        ]
    else:
        modes = [m for m in BUILTIN_MODES if m.label in labels]
    return [GatewayContender(m) for m in (*modes, *extra)]
