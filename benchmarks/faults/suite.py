"""One run of the fault suite: start the fleet and the gateway, load, faults, attack, account."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.faults.accounting import summarize
from benchmarks.faults.clients import LoadSettings, SlowlorisStats, run_load, slowloris
from benchmarks.faults.procs import (
    HOST,
    SIM,
    Gateway,
    ProcessError,
    SimReplica,
    by_label,
    free_ports,
    gateway_metrics,
    rss_kib,
    set_faults,
)
from benchmarks.faults.timeline import CLEAR, Event, plan, run_timeline
from benchmarks.routing_bench.fleet import SimParams
from simulator.config import SimConfig

MODEL = SimConfig().model
# Slack over header_timeout_s for a slowloris connection to be cut on a loaded 2-core machine.
SLOWLORIS_SLACK_S = 5.0


@dataclass(frozen=True, slots=True)
class Params:
    """Everything one run depends on (results.json `parameters`)."""

    out: Path
    replicas: int = 4
    load: LoadSettings = field(default_factory=LoadSettings)
    sim: SimParams = SIM
    slowloris_connections: int = 256
    slowloris_gap_s: float = 1.0
    # The gateway's [server] header_timeout_s (its default) and the per-try timeouts under test.
    header_timeout_s: float = 10.0
    response_head_timeout_s: float = 2.0
    idle_timeout_s: float = 3.0
    # Stall faults last this long: past both timeouts above.
    stall_s: float = 6.0
    # After the load: how long in-flight may take to return to 0.
    settle_s: float = 15.0
    max_rss_growth_mib: float = 128.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["out"] = str(self.out)
        return out


def gateway_toml(p: Params, port: int, replicas: list[SimReplica]) -> str:
    """The configuration under test: defaults, but for timeouts a 3-minute run can exercise."""
    lines = [
        "[server]",
        f'host = "{HOST}"',
        f"port = {port}",
        "drain_timeout_s = 2.0",
        f"header_timeout_s = {p.header_timeout_s}",
        "",
        "[upstream]",
        "connect_timeout_s = 1.0",
        f"response_head_timeout_s = {p.response_head_timeout_s}",
        "first_byte_timeout_s = 10.0",
        f"idle_timeout_s = {p.idle_timeout_s}",
        "non_stream_timeout_s = 30.0",
        "",
        "[health_check]",
        "interval_s = 0.5",
        "timeout_s = 0.5",
        "",
        "# Short ejections and a quick ramp: every replica is back before its next fault.",
        "[outlier]",
        "base_ejection_s = 2.0",
        "max_ejection_s = 10.0",
        "decay_s = 20.0",
        "ramp_start = 0.1",
        "ramp_factor = 2.0",
        "ramp_step_s = 1.0",
        "",
    ]
    for r in replicas:
        lines += ["[[replicas]]", f'url = "{r.url}"', f'name = "{r.name}"', ""]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _processes(p: Params) -> AsyncIterator[tuple[Gateway, list[SimReplica]]]:
    with tempfile.TemporaryDirectory(prefix="llmgw-faults-") as tmp:
        work = Path(tmp)
        *ports, gw_port = free_ports(p.replicas + 1)
        replicas = [SimReplica(i, port, p.sim, work) for i, port in enumerate(ports)]
        gateway = Gateway(gateway_toml(p, gw_port, replicas), gw_port, work)
        try:
            await asyncio.gather(*(r.start() for r in replicas))
            await gateway.start()
            yield gateway, replicas
        finally:
            await gateway.stop()
            await asyncio.gather(*(r.stop() for r in replicas))


async def _warm_up(session: aiohttp.ClientSession, url: str, n: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
    for _ in range(n):
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise ProcessError(f"warm-up request answered {r.status}: {await r.text()}")


async def _sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, ProcessError):
            peak[0] = max(peak[0], rss_kib(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)  # a sampling period, or the stop


def _busy(m: Mapping[str, float]) -> tuple[int, int]:
    """(requests in flight to replicas, requests in the admission queue) by the gateway."""
    return int(m.get("llm_gateway_in_flight_requests", 0)), int(m.get("llm_request_queue_depth", 0))


async def _settle(
    session: aiohttp.ClientSession, url: str, within_s: float
) -> tuple[int, int, float]:
    """Poll the gateway's /metrics until nothing is in flight or queued; (in flight, queued, s)."""
    start = time.monotonic()
    while True:
        busy = _busy(await gateway_metrics(session, url))
        waited = time.monotonic() - start
        if busy == (0, 0) or waited > within_s:
            return busy[0], busy[1], waited
        await asyncio.sleep(0.1)  # polling a condition under a deadline


def _delta(
    after: Mapping[str, float], before: Mapping[str, float], name: str, label: str
) -> dict[str, int]:
    a, b = by_label(after, name, label), by_label(before, name, label)
    return {k: int(v - b.get(k, 0.0)) for k, v in sorted(a.items()) if v - b.get(k, 0.0)}


async def measure(p: Params) -> dict[str, Any]:
    """One whole run; the results dict (see the package docstring)."""
    started = time.monotonic()
    faults = plan(p.stall_s)
    load = p.load
    async with _processes(p) as (gateway, replicas), aiohttp.ClientSession() as session:
        await _warm_up(session, gateway.url, 2 * p.replicas)
        before = await gateway_metrics(session, gateway.url)
        rss_before = rss_kib(gateway.pid)
        peak = [rss_before]
        stop = asyncio.Event()
        print(
            f"faults: {load.concurrency} clients for {load.duration_s:g} s, "
            f"{p.slowloris_connections} slowloris connections, {len(faults)} faults",
            flush=True,
        )
        t0 = time.monotonic()
        start_s, window_s = 0.05 * load.duration_s, 0.9 * load.duration_s / len(faults)
        sampler = asyncio.create_task(_sample_rss(gateway.pid, peak, stop))
        attack = asyncio.create_task(
            slowloris(gateway.port, p.slowloris_connections, p.slowloris_gap_s, stop)
        )
        timeline = asyncio.create_task(run_timeline(faults, replicas, t0, start_s, window_s))
        run = await run_load(load, gateway.url, MODEL)
        load_s = time.monotonic() - t0
        events: list[Event] = await timeline
        stop.set()
        attacked: SlowlorisStats = await attack
        await sampler
        for r in replicas:  # whatever the timeline managed, the fleet ends clean
            if r.pid is None:
                await r.start()
            await set_faults(session, r.url, CLEAR)
        in_flight, queued, settled_s = await _settle(session, gateway.url, p.settle_s)
        after = await gateway_metrics(session, gateway.url)
        rss_after = rss_kib(gateway.pid)
        alive = gateway.alive
        toml = gateway.toml
    summary = summarize(run.records, run.sent)
    retries = _delta(after, before, "llm_gateway_upstream_retries_total", "reason")
    answered = _delta(after, before, "llm_gateway_requests_total", "status")
    mib = 1024.0
    results: dict[str, Any] = {
        "parameters": p.to_json(),
        "faults": [
            {
                "name": f.name,
                "replica": f"r{f.replica}",
                "action": f.action,
                "patch": f.patch,
                "expect": f.expect,
            }
            for f in faults
        ],
        "timeline": [e.to_json() for e in events],
        "summary": {
            **summary.to_json(),
            "retried": sum(retries.values()),
            "retries_by_reason": retries,
            "retries_refused": int(
                after.get("llm_gateway_retries_refused_total", 0)
                - before.get("llm_gateway_retries_refused_total", 0)
            ),
            "ejections_by_reason": _delta(
                after, before, "llm_gateway_outlier_ejections_total", "reason"
            ),
            "streams_truncated": int(
                after.get("llm_gateway_streams_truncated_total", 0)
                - before.get("llm_gateway_streams_truncated_total", 0)
            ),
            "gateway_answered": sum(answered.values()),
            "gateway_answered_by_status": answered,
            "in_flight_at_end": in_flight,
            "queued_at_end": queued,
            "settled_in_s": round(settled_s, 2),
            "rss_mib": {
                "before": round(rss_before / mib, 1),
                "peak": round(peak[0] / mib, 1),
                "after": round(rss_after / mib, 1),
            },
            "gateway_alive_at_end": alive,
        },
        "slowloris": attacked.to_json(),
        "gateway_toml": toml,
        "load_s": round(load_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }
    results["checks"] = checks(results, p)
    return results


def checks(results: Mapping[str, Any], p: Params) -> list[dict[str, Any]]:
    """Each verdict of the run: what, the figure, the bound, passed."""
    s, sl = results["summary"], results["slowloris"]
    growth = s["rss_mib"]["after"] - s["rss_mib"]["before"]
    bound = p.header_timeout_s + SLOWLORIS_SLACK_S
    rows = [
        ("nothing lost", s["lost"], "== 0", s["lost"] == 0),
        ("counts match", s["counts_match"], "completed+errors+cancelled+lost == sent",
         s["counts_match"]),
        ("in flight back to 0", s["in_flight_at_end"], "== 0", s["in_flight_at_end"] == 0),
        ("admission queue empty", s["queued_at_end"], "== 0", s["queued_at_end"] == 0),
        ("gateway alive", s["gateway_alive_at_end"], "true", bool(s["gateway_alive_at_end"])),
        ("the gateway counted every request", s["gateway_answered"], f"== {s['sent']} sent",
         s["gateway_answered"] == s["sent"]),
        ("RSS growth MiB (after - before)", round(growth, 1), f"<= {p.max_rss_growth_mib:g}",
         growth <= p.max_rss_growth_mib),
        ("slowloris cut (longest open, s)", sl["longest_open_s"], f"<= {bound:g}",
         sl["longest_open_s"] <= bound and sl["connections_opened"] > 0),
        ("every fault applied", sum(1 for e in results["timeline"] if "error" not in e),
         f"== {2 * len(results['faults'])} steps",
         all("error" not in e for e in results["timeline"])),
    ]  # fmt: skip
    return [{"check": c, "value": v, "bound": b, "passed": ok} for c, v, b, ok in rows]
