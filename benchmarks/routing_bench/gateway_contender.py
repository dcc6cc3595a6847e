"""Our gateway as a contender: `python -m gateway.cli serve` in a child process, one per profile."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.procs import http_status, stop_process
from benchmarks.routing_bench.contenders import ContenderUnavailable, FleetInfo

_REPO = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class GatewayMode:
    """One gateway contender: the routing profile and how the prefix index is fed.

    precise: replicas' KV events + the replicas' tokenizer (the precise prefix index);
    otherwise no events and no tokenizer (character blocks: the approximate index).
    extra_toml: more TOML appended to the config (e.g. `[routing.profiles.X]` tables).
    """

    label: str
    profile: str
    precise: bool = False
    extra_toml: str = ""


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


def gateway_toml(mode: GatewayMode, fleet: FleetInfo, host: str, port: int) -> str:
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
    return "\n".join(lines) + ("\n" + mode.extra_toml if mode.extra_toml else "")


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
        self._proc: asyncio.subprocess.Process | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self, fleet: FleetInfo) -> str:
        self._tmp = tempfile.TemporaryDirectory(prefix="llmgw-bench-")
        work = Path(self._tmp.name)
        port = _free_port(self._host)
        cfg = work / "gateway.toml"
        cfg.write_text(gateway_toml(self.mode, fleet, self._host, port))
        log = work / "gateway.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
        with log.open("wb") as err:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway.cli",
                "--log-level",
                "warning",
                "serve",
                "-c",
                str(cfg),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=_REPO,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                tail = log.read_text(errors="replace")[-1500:]
                await self.stop()
                raise ContenderUnavailable(f"gateway exited ({self._proc_rc()}): {tail}")
            try:
                async with asyncio.timeout(1.0):
                    code = await http_status(self._host, port, "/ready")
                if code == 200:
                    return f"http://{self._host}:{port}"
                last = f"HTTP {code}"
            except (OSError, TimeoutError, ValueError, IndexError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.1)  # polling readiness under a deadline
        tail = log.read_text(errors="replace")[-1500:]
        await self.stop()
        raise ContenderUnavailable(f"gateway not ready in {_START_TIMEOUT_S:g} s ({last}): {tail}")

    def _proc_rc(self) -> str:
        return "?" if self._proc is None else str(self._proc.returncode)

    async def stop(self) -> None:
        await stop_process(self._proc)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def pids(self) -> list[int]:
        p = self._proc
        return [p.pid] if p is not None and p.returncode is None else []


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
