"""The fault run on real vLLM: one CPU replica SIGKILLed under load and restarted on its port.

Per phase, a gateway starts in-process in front of the same fleet (so `vllm_observe` can see
its pool), closed-loop clients stream and send whole requests, and the last replica's process
group is SIGKILLed, restarted, and routed to again. Phase "on" runs the gateway's retries and
passive ejection; phase "off" the same kill with both off (health checks alike), so the
clients' errors show what the mechanisms buy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.faults.accounting import ERROR, Record, summarize
from benchmarks.faults.clients import LoadRun, LoadSettings, run_load
from benchmarks.faults.vllm_observe import (
    Observer,
    acquired_between,
    budget_view,
    ejection_after,
    first_event,
    first_sample,
    routed_while_out,
    share_windows,
)
from benchmarks.vllm_cpu import VllmFleet
from benchmarks.vllm_cpu.engine_env import VllmCpuError
from gateway.config import (
    CacheIndexConfig,
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    ScoreLoopConfig,
    ServerConfig,
    UpstreamConfig,
)
from gateway.process import RunningGateway, running_gateway
from gateway.replicas.outlier import OutlierConfig
from telemetry.prom_text import samples

MODES = ("on", "off")
_HTTP = aiohttp.ClientTimeout(total=10.0)
# vLLM's finish reasons of a request it served to the end (abort and error did not).
_SERVED = ("length", "stop")
_RETRIES, _REFUSED = "llm_gateway_upstream_retries_total", "llm_gateway_retries_refused_total"


def _load() -> LoadSettings:
    # 2 cores for 3 replicas, their API servers and the gateway: modest and short. Mostly new
    # prompts: a returning replica holds no prefix, so only new conversations show its ramp
    # (with 64 prompts every one had a home on a survivor and it got nothing).
    return LoadSettings(
        concurrency=24, duration_s=600.0, deadline_s=60.0, min_tokens=16, max_tokens=64,
        unary_share=0.25, cancel_share=0.0, prompts=2048,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class VllmParams:
    """Everything one real-vLLM run depends on (results.json `parameters`)."""

    out: Path
    replicas: int = 3
    load: LoadSettings = field(default_factory=_load)
    modes: tuple[str, ...] = MODES
    kill_at_s: float = 20.0
    # SIGKILL to the restart's start: full load on the survivors meanwhile.
    restart_after_s: float = 15.0
    # Clients while the replica restarts (until the gateway routes to it again). 0: on 2
    # cores two busy survivors starve a restart; with 2 clients it took over 300 s.
    trickle: int = 0
    # Load kept up after the gateway routes to the restarted replica again (the ramp).
    after_return_s: float = 45.0
    window_s: float = 10.0
    # A quicker ramp than the default (1%, x1.5 per 10 s: 120 s): 10%, x2 every 10 s (40 s).
    ramp_start: float = 0.1
    ramp_factor: float = 2.0
    ramp_step_s: float = 10.0
    settle_s: float = 15.0
    num_gpu_blocks: int = 512
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        if self.replicas < 2 or not set(self.modes) <= set(MODES) or not self.modes:
            raise ValueError(f"replicas must be >= 2 and modes a subset of {MODES}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["out"] = str(self.out)
        return out


def gateway_config(fleet: VllmFleet, p: VllmParams, mode: str) -> GatewayConfig:
    """The gateway's defaults but the ramp; "off": no retries, no passive ejection."""
    outlier = OutlierConfig(
        ramp_start=p.ramp_start, ramp_factor=p.ramp_factor, ramp_step_s=p.ramp_step_s
    )
    upstream = UpstreamConfig()
    if mode == "off":
        outlier = replace(
            outlier, consecutive_failures=0, failure_rate=0.0, oom_patterns=(),
            max_preemptions_per_scrape=0,
        )  # fmt: skip
        upstream = replace(upstream, max_retries=0)
    return GatewayConfig(
        server=ServerConfig(port=0),
        upstream=upstream,
        # vLLM's API server can stall for seconds on 2 busy cores (tests/vllm/conftest.py).
        health_check=HealthCheckConfig(timeout_s=2.0),
        score_loop=ScoreLoopConfig(scrape_timeout_s=5.0),
        cache_index=CacheIndexConfig(tokenizer=str(fleet.model_dir), block_size=fleet.block_size),
        outlier=outlier,
        replicas=tuple(ReplicaConfig(url=r.url, name=r.name, kv_events="") for r in fleet.replicas),
    )


async def _text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics", timeout=_HTTP) as r:
        r.raise_for_status()
        return await r.text()


async def vllm_served(session: aiohttp.ClientSession, url: str) -> int:
    """Requests a replica finished serving (vllm:request_success_total, length or stop)."""
    rows = samples(await _text(session, url), "vllm:request_success_total")
    return int(sum(v for labels, v in rows if labels.get("finished_reason") in _SERVED))


async def gateway_served(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    """Per replica: answers relayed whole (status 200, less the streams truncated mid-way)."""
    text = await _text(session, url)
    out: dict[str, int] = {}
    for labels, v in samples(text, "llm_gateway_requests_total"):
        if labels.get("status") == "200" and labels.get("replica"):
            out[labels["replica"]] = out.get(labels["replica"], 0) + int(v)
    for labels, v in samples(text, "llm_gateway_streams_truncated_total"):
        out[labels["replica"]] = out.get(labels["replica"], 0) - int(v)
    return out


async def gateway_counter(session: aiohttp.ClientSession, url: str, name: str) -> float:
    return sum(v for _, v in samples(await _text(session, url), name))


async def _warm_up(session: aiohttp.ClientSession, gw: RunningGateway, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
    for _ in range(2 * len(gw.runtime.pool.replicas)):
        async with session.post(gw.url + "/v1/chat/completions", json=body, timeout=_HTTP) as r:
            if r.status != 200:
                raise RuntimeError(f"warm-up answered {r.status}: {await r.text()}")


async def _poll(probe: Any, within_s: float, what: str) -> float:
    """Poll a sync predicate until true; seconds taken (raises after `within_s`)."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > within_s:
            raise TimeoutError(f"{what} not within {within_s:g} s")
        await asyncio.sleep(0.02)  # polling a condition under a deadline
    return time.monotonic() - start


class _Segments:
    """Closed-loop load in segments of their own concurrency, on one clock and one numbering."""

    def __init__(self, settings: LoadSettings, url: str, model: str, t0: float) -> None:
        self._settings, self._url, self._model, self._t0 = settings, url, model, t0
        self._runs: list[LoadRun] = []
        self.segments: list[dict[str, Any]] = []

    async def run(self, concurrency: int, stop: Callable[[], bool]) -> None:
        settings = replace(
            self._settings, concurrency=concurrency, seed=self._settings.seed + len(self._runs)
        )
        start = time.monotonic() - self._t0
        run = await run_load(settings, self._url, self._model, stop)
        self._runs.append(run)
        end = time.monotonic() - self._t0
        self.segments.append({"clients": concurrency, "from_s": round(start, 2),
                              "to_s": round(end, 2), "sent": run.sent})  # fmt: skip

    def records(self) -> tuple[list[Record], int]:
        """Every segment's records, renumbered and timed from t0; the requests sent."""
        out: list[Record] = []
        sent = 0
        for run in self._runs:
            shift = run.t0 - self._t0
            out += [
                replace(r, index=r.index + sent, started=r.started + shift, ended=r.ended + shift)
                for r in run.records
            ]
            sent += run.sent
        return out, sent


async def run_phase(fleet: VllmFleet, p: VllmParams, mode: str) -> dict[str, Any]:
    """One gateway, the load, the kill and the restart; the phase's figures and checks."""
    v = p.replicas - 1
    victim = fleet.replicas[v].name
    names = tuple(r.name for r in fleet.replicas)
    flags, marks, failure = [False, False, False], {}, ""
    async with (
        running_gateway(gateway_config(fleet, p, mode)) as gw,
        aiohttp.ClientSession() as session,
    ):
        pool = gw.runtime.pool
        await _poll(lambda: all(r.healthy and r.models for r in pool), 60.0, "fleet healthy")
        await _warm_up(session, gw, fleet.model)
        gw_before = await gateway_served(session, gw.url)
        vllm_before = [await vllm_served(session, r.url) for r in fleet.replicas]
        retries_before = await gateway_counter(session, gw.url, _RETRIES)
        refused_before = await gateway_counter(session, gw.url, _REFUSED)
        t0 = time.monotonic()
        obs = Observer(gw.runtime, names, t0)
        stop = asyncio.Event()
        with obs.capturing():
            sampler = asyncio.create_task(obs.run(stop))
            load = _Segments(p.load, gw.url, fleet.model, t0)
            full = asyncio.create_task(load.run(p.load.concurrency, lambda: flags[0]))
            await asyncio.sleep(max(0.0, t0 + p.kill_at_s - time.monotonic()))  # the schedule
            vllm_pre_kill = await vllm_served(session, fleet.replicas[v].url)
            marks["kill"] = time.monotonic() - t0
            await fleet.kill(v)
            marks["killed"] = time.monotonic() - t0
            await asyncio.sleep(p.restart_after_s)  # full load on the survivors meanwhile
            flags[0] = True
            await full
            # Under full load on 2 cores a restart took over 300 s (see VllmParams.trickle).
            trickle = asyncio.create_task(load.run(p.trickle, lambda: flags[1]))
            marks["restart"] = time.monotonic() - t0
            gw_at_restart = await gateway_served(session, gw.url)
            try:
                marks["vllm_start_s"] = await fleet.restart(v)
                marks["vllm_healthy"] = time.monotonic() - t0
                await _poll(lambda: pool[victim].healthy, 30.0, f"{victim} routable again")
            except (VllmCpuError, TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {str(exc)[:500]}"
            marks["routable_again"] = time.monotonic() - t0
            flags[1] = True
            await trickle
            if not failure:
                again = asyncio.create_task(load.run(p.load.concurrency, lambda: flags[2]))
                await asyncio.sleep(p.after_return_s)  # load on the returned replica: its ramp
                flags[2] = True
                await again
            marks["load_end"] = time.monotonic() - t0
            busy = lambda: sum(r.in_flight for r in pool) == 0 and obs.sample().queued == 0  # noqa: E731
            try:
                settled_s = await _poll(busy, p.settle_s, "in flight back to 0")
            except TimeoutError:
                settled_s = -1.0  # the check on in_flight_at_end fails with the figure
            stop.set()
            await sampler
        gw_after = await gateway_served(session, gw.url)
        # A replica whose restart failed has no counter: -1, and the check fails on it.
        vllm_after = [
            await vllm_served(session, r.url) if fleet.alive(i) else -1
            for i, r in enumerate(fleet.replicas)
        ]
        retried = await gateway_counter(session, gw.url, _RETRIES)
        refused = await gateway_counter(session, gw.url, _REFUSED)
        cfg = gw.runtime.config.upstream
    records, sent = load.records()
    summary = summarize(records, sent)
    samples, events = obs.samples, obs.events
    kill = marks["kill"]
    ejection = ejection_after(events, victim, kill)
    down = first_event(events, f"replica {victim} is down", kill)
    unroutable = first_sample(samples, kill, False, v)
    back = marks["routable_again"]
    out_end = first_sample(samples, marks["restart"], True, v) or back
    errors = [r for r in records if r.kind == ERROR]
    gw_served_total = sum(gw_after.values()) - sum(gw_before.values())
    agreement = []
    for i, name in enumerate(names):
        if i == v:
            pre_gw = gw_at_restart.get(name, 0) - gw_before.get(name, 0)
            agreement.append({
                "replica": name, "killed": True,
                "gateway_before_kill": pre_gw, "vllm_before_kill": vllm_pre_kill - vllm_before[i],
                "gateway_after_restart": gw_after.get(name, 0) - gw_at_restart.get(name, 0),
                "vllm_after_restart": vllm_after[i],
            })  # fmt: skip
        else:
            agreement.append({
                "replica": name, "killed": False,
                "gateway": gw_after.get(name, 0) - gw_before.get(name, 0),
                "vllm": vllm_after[i] - vllm_before[i],
            })  # fmt: skip
    result: dict[str, Any] = {
        "mode": mode,
        "victim": victim,
        "marks_s": {k: round(x, 3) for k, x in marks.items()},
        "restart_failure": failure,
        "segments": load.segments,
        "summary": {
            **summary.to_json(),
            "retried": int(retried - retries_before),
            "retries_refused": int(refused - refused_before),
            "gateway_served": gw_served_total,
            "errors_ended_after_kill_s": sorted(round(r.ended - kill, 2) for r in errors),
        },
        "ejection": {
            "ejected_after_kill_s": None if ejection is None else round(ejection[0] - kill, 3),
            # SIGKILL to the process's exit: a 3 GB process takes a while to die on busy cores,
            # and its sockets close only then.
            "exited_after_kill_s": round(marks["killed"] - kill, 3),
            "rule": None if ejection is None else ejection[1],
            "health_down_after_kill_s": None if down is None else round(down - kill, 3),
            "unroutable_after_kill_s": None if unroutable is None else round(unroutable - kill, 3),
            "attempts_to_victim_kill_to_unroutable": acquired_between(
                samples, v, kill, unroutable or kill
            ),
            "attempts_to_victim_while_unroutable": routed_while_out(samples, v, kill, out_end),
            "attempts_to_victim_after_return": acquired_between(samples, v, back, samples[-1].t),
        },
        "ramp_windows": share_windows(samples, v, back, p.window_s),
        "share_before_kill": share_windows(samples, v, max(0.0, kill - p.window_s), p.window_s)[:1],
        "retry_budget": {
            "ratio": cfg.retry_budget_ratio,
            "min_retry_concurrency": cfg.min_retry_concurrency,
            **budget_view(samples, cfg.retry_budget_ratio, cfg.min_retry_concurrency),
        },
        "in_flight_settled_in_s": round(settled_s, 2),
        "in_flight_at_end": sum(samples[-1].in_flight),
        "queued_at_end": samples[-1].queued,
        "agreement": agreement,
        "log": [{"t": round(e.t, 3), "logger": e.logger, "line": e.message} for e in events],
    }
    result["checks"] = phase_checks(result)
    return result


def phase_checks(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each verdict of one phase: what, the figure, the bound, passed."""
    s, e, b = r["summary"], r["ejection"], r["retry_budget"]
    survivors = [a for a in r["agreement"] if not a["killed"]]
    killed = [a for a in r["agreement"] if a["killed"]]
    rows: list[tuple[str, Any, str, bool]] = [
        ("nothing lost (hangs included)", s["lost"], "== 0", s["lost"] == 0),
        ("counts match", s["counts_match"], "completed+errors+lost == sent", s["counts_match"]),
        ("in flight back to 0", r["in_flight_at_end"], "== 0", r["in_flight_at_end"] == 0),
        ("admission queue empty", r["queued_at_end"], "== 0", r["queued_at_end"] == 0),
        ("no attempt to the victim while unroutable", e["attempts_to_victim_while_unroutable"],
         "== 0", e["attempts_to_victim_while_unroutable"] == 0),
        ("routed to again after restart", e["attempts_to_victim_after_return"], "> 0",
         e["attempts_to_victim_after_return"] > 0),
        ("retries in flight within the budget (samples over)", b["samples_over_bound"], "== 0",
         b["samples_over_bound"] == 0),
        ("clients' completions == gateway's", s["completed"], f"== {s['gateway_served']}",
         s["completed"] == s["gateway_served"]),
        ("survivors: gateway == vLLM request_success", [a["gateway"] for a in survivors],
         f"== {[a['vllm'] for a in survivors]}", all(a["gateway"] == a["vllm"] for a in survivors)),
        ("restarted victim: gateway == vLLM", [a["gateway_after_restart"] for a in killed],
         f"== {[a['vllm_after_restart'] for a in killed]}",
         all(a["gateway_after_restart"] == a["vllm_after_restart"] for a in killed)),
    ]  # fmt: skip
    if r["mode"] == "on":
        rows.append(("ejected by the gateway", e["rule"], "a passive rule", e["rule"] is not None))
    return [{"check": c, "value": v, "bound": bd, "passed": ok} for c, v, bd, ok in rows]


async def measure_vllm(p: VllmParams) -> dict[str, Any]:
    """Start the fleet, run each phase against it, stop it; the results dict."""
    started = time.monotonic()
    fleet = VllmFleet(
        p.replicas, num_gpu_blocks=p.num_gpu_blocks, max_model_len=p.max_model_len,
        kv_events=False, lora=False, startup_timeout_s=300.0,
    )  # fmt: skip
    async with fleet:
        start_s = round(time.monotonic() - started, 1)
        phases: list[dict[str, Any]] = []
        for mode in p.modes:
            print(f"faults (vllm-cpu): phase {mode}", flush=True)
            phases.append(await run_phase(fleet, p, mode))
    return {
        "parameters": p.to_json(),
        "fleet": {"replicas": p.replicas, "model": fleet.model, "start_s": start_s},
        "phases": phases,
        "checks": [
            {**c, "check": f"{ph['mode']}: {c['check']}"} for ph in phases for c in ph["checks"]
        ],
        "wall_s": round(time.monotonic() - started, 1),
    }
