"""The fault timeline: every fault the simulator offers, on one replica after another, plus a
SIGKILL and restart on the same port; each step's planned and actual time is recorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from benchmarks.faults.procs import SimReplica, engine_restart, set_faults
from benchmarks.overhead_procs import BenchProcessError
from simulator.config import Faults

CLEAR = Faults().to_json()


@dataclass(frozen=True, slots=True)
class Fault:
    """One window: on `replica`, `action` with `patch` from its start to its end."""

    name: str
    replica: int
    # "faults": POST the patch, cleared at the end; "kill": SIGKILL, restarted at the end;
    # "engine_restart": the patch, then /_sim/restart (its requests dropped), cleared at the end.
    action: str
    patch: dict[str, Any]
    expect: str


def plan(stall_s: float) -> tuple[Fault, ...]:
    """Every simulator fault, in turn over the replicas (`stall_s`: longer than the timeouts)."""
    return (
        Fault("error_500", 0, "faults", {"error_rate": 1.0, "error_status": 500},
              "5xx before the first byte: retried elsewhere; consecutive failures eject"),
        Fault("reset_before_first_byte", 1, "faults", {"reset_before_first_byte": True},
              "connection reset before the head: retried elsewhere"),
        Fault("reset_after_tokens", 2, "faults", {"reset_after_tokens": 5},
              "reset mid-stream: the stream ends with the gateway's SSE error event"),
        Fault("stall_before_head", 3, "faults", {"stall_seconds": stall_s},
              "no head within response_head_timeout_s: retried elsewhere"),
        Fault("stall_mid_stream", 0, "faults", {"stall_seconds": stall_s, "stall_after_tokens": 4},
              "silent mid-stream past idle_timeout_s: SSE error event"),
        Fault("out_of_kv", 1, "faults", {"out_of_kv": True},
              "500 'Insufficient KV cache': ejected at once, retried elsewhere"),
        Fault("unhealthy", 2, "faults", {"unhealthy": True},
              "/health 503: marked down by probes, its streams finish"),
        Fault("dead", 3, "faults", {"dead": True},
              "engine dead: its streams end with its error event, new requests 500 (retried)"),
        Fault("sigkill", 0, "kill", {},
              "process killed: resets mid-stream (SSE error), refused connects (retried); "
              "restarted on its port at the window's end"),
        Fault("error_503_30pct", 1, "faults", {"error_rate": 0.3, "error_status": 503},
              "30% 503: retried; the failure rate ejects"),
        Fault("engine_restart_slow_start", 2, "engine_restart", {"slow_start_seconds": stall_s},
              "engine restart drops its requests (resets), then /health fails for a while"),
        Fault("error_429_50pct", 3, "faults", {"error_rate": 0.5, "error_status": 429},
              "half its answers 429 in vLLM's shape: relayed to the client, not retried"),
    )  # fmt: skip


@dataclass
class Event:
    """What the timeline did, when (seconds since the load started), and whether it worked."""

    at_s: float
    fault: str
    replica: str
    what: str
    ok: bool = True
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "at_s": round(self.at_s, 2),
            "fault": self.fault,
            "replica": self.replica,
            "what": self.what,
        }
        if not self.ok:
            out["error"] = self.error
        return out


async def _begin(session: aiohttp.ClientSession, fault: Fault, replica: SimReplica) -> str:
    if fault.action == "kill":
        await replica.kill()
        return "SIGKILL"
    await set_faults(session, replica.url, fault.patch)
    if fault.action == "engine_restart":
        await engine_restart(session, replica.url)
        return f"faults {fault.patch}, then /_sim/restart"
    return f"faults {fault.patch}"


async def _end(session: aiohttp.ClientSession, fault: Fault, replica: SimReplica) -> str:
    if fault.action == "kill":
        await replica.start()
        return f"restarted on port {replica.port}"
    await set_faults(session, replica.url, CLEAR)
    return "faults cleared"


async def run_timeline(
    faults: Sequence[Fault],
    replicas: Sequence[SimReplica],
    t0: float,
    start_s: float,
    window_s: float,
) -> list[Event]:
    """Window i runs from start_s + i * window_s for 0.8 window_s (then a clean gap)."""
    events: list[Event] = []
    async with aiohttp.ClientSession() as session:
        for i, fault in enumerate(faults):
            replica = replicas[fault.replica % len(replicas)]
            for phase, at in (("begin", start_s + i * window_s), ("end", None)):
                if at is None:
                    at = start_s + (i + 0.8) * window_s
                delay = t0 + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # the timeline's own schedule
                event = Event(time.monotonic() - t0, fault.name, replica.name, phase)
                try:
                    action = _begin if phase == "begin" else _end
                    event.what = f"{phase}: {await action(session, fault, replica)}"
                except (BenchProcessError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                    event.ok, event.error = False, f"{type(exc).__name__}: {exc}"
                events.append(event)
    return events
