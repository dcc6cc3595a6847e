"""`llm-gateway bench tenants`: a greedy tenant cannot slow another; P0 jumps a P2 flood.

Processes: one simulated replica per process and one `llm-gateway serve` per part (the
benchmarks/faults processes), this process as the clients.

Part 1, isolation (default profile): tenant A sends streams open-loop (Poisson, `a_rate`
req/s); tenant B, with quotas `b_rpm` requests per minute and `b_max_concurrent`, sends 10x its
per-minute quota. Phases interleave in one run: A alone, A+B, A alone, A+B (`phase_s` each).
A's TTFT (send to the first SSE event) p90 over the A+B phases against the A-alone ones must
be within +10%; each phase's figures are reported too.

Part 2, priority (a profile admitting `slots_per_replica` requests per replica, so the rest
wait in the admission queue): probes alone measure a P0 request's unqueued TTFT; then one
tenant keeps a P2 flood queued (closed loop, `flood_queue` more clients than slots) while a P0
probe is sent about every `probe_gap_s`. A request's dispatch = its first byte - the unqueued
TTFT (one prompt for all). A probe's queue wait = its TTFT - the unqueued TTFT; one dispatch
slot = the flood's mean interval between dispatches; `p2_ahead` = P2 requests dispatched while
the probe waited (0: it took the next free slot; FIFO would put the whole backlog ahead). The
checks: the probes' median wait is at most one dispatch slot, and no probe had more than one P2
dispatched ahead of it (one: two slots freeing within the first-byte timing's jitter).

results.json: `meta`, `parameters`, `isolation` {`phases`: [{phase, a: {sent, ok, errors,
ttft_p50_s, ttft_p90_s}, b: {sent, ok, refused_by_limit}}], `a_alone_p90_s`, `a_with_b_p90_s`,
`p90_ratio`, `b_quota_refusals` (the gateway's metric)}, `priority` {`unqueued_ttft_s`,
`dispatch_interval_s`, `probes`: [{status, wait_s, wait_slots, p2_ahead}],
`median_wait_slots`, `max_wait_slots`, `median_p2_ahead`, `max_p2_ahead`}, `checks`. Exit 1
when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from benchmarks.faults.procs import (
    HOST,
    SIM,
    Gateway,
    SimReplica,
    by_label,
    free_ports,
    gateway_metrics,
)
from benchmarks.overhead_procs import machine_info
from benchmarks.tenants_report import checks, markdown
from simulator.config import SimConfig

MODEL = SimConfig().model
_WORDS = ("amber", "basalt", "cedar", "dune", "ember", "fjord", "granite", "heath", "island",
          "jade", "kelp", "lagoon", "mesa", "nectar", "onyx", "prairie")  # fmt: skip
_DEADLINE_S = 60.0


@dataclass(frozen=True, slots=True)
class Params:
    out: Path
    replicas: int = 4
    phase_s: float = 20.0
    a_rate: float = 8.0
    b_rpm: int = 30
    b_max_concurrent: int = 1
    max_tokens: int = 64
    prompt_words: int = 250
    slots_per_replica: int = 2
    flood_queue: int = 40
    flood_s: float = 20.0
    probe_gap_s: float = 1.0
    baseline_probes: int = 10
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "out": str(self.out)}


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's end: status, TTFT (None without a first event), complete, sent/first at."""

    status: int
    ttft_s: float | None
    complete: bool
    sent_at: float
    detail: str = ""


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile, linear between order statistics (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _message(body: bytes) -> str:
    """The message of vLLM's error body ("" when it is not one)."""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        return str(orjson.loads(body)["error"]["message"])
    return ""


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def stream(
    session: aiohttp.ClientSession, url: str, key: str, prompt: str, max_tokens: int, **hdr: str
) -> Answer:
    """One streamed chat: time to its first SSE event, and whether [DONE] came."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}  # fmt: skip
    headers = {"authorization": f"Bearer {key}", **hdr}
    sent = time.monotonic()
    ttft: float | None = None
    try:
        async with (
            asyncio.timeout(_DEADLINE_S),
            session.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            if r.status != 200:
                return Answer(r.status, None, False, sent, _message(await r.read()))
            done = False
            async for line in r.content:
                if line.startswith(b"data:"):
                    if ttft is None:
                        ttft = time.monotonic() - sent
                    done = line.strip() == b"data: [DONE]"
            return Answer(200, ttft, done, sent)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return Answer(0, ttft, False, sent, type(exc).__name__)


async def open_loop(
    rate: float,
    duration_s: float,
    rng: random.Random,
    send: Callable[[], Coroutine[Any, Any, Answer]],
) -> list[Answer]:
    """Poisson arrivals at `rate` for `duration_s`; every request's answer, once all ended."""
    tasks: list[asyncio.Task[Answer]] = []
    end = time.monotonic() + duration_s
    while True:
        await asyncio.sleep(rng.expovariate(rate))  # the arrival process itself
        if time.monotonic() >= end:
            break
        tasks.append(asyncio.create_task(send()))
    return list(await asyncio.gather(*tasks))


def _tenant(name: str, **limits: int) -> list[str]:
    return [f"[tenancy.tenants.{name}]", f'keys = ["{name}-key"]'] + [
        f"{k} = {v}" for k, v in limits.items()
    ]


def gateway_toml(p: Params, port: int, urls: list[str], part: str) -> str:
    lines = ["[server]", f'host = "{HOST}"', f"port = {port}", "drain_timeout_s = 2.0", ""]
    if part == "isolation":
        lines += [*_tenant("A"), ""]
        lines += _tenant("B", requests_per_minute=p.b_rpm, max_concurrent=p.b_max_concurrent)
    else:
        # Each replica admits slots_per_replica requests; the rest wait in the gateway's queue.
        lines += ["[routing]", 'profile = "slots"', "", "[routing.profiles.slots]",
                  'filters = [{ type = "healthy" }, { type = "serves_model" }, { type = '
                  f'"saturation", params = {{ max_in_flight = {p.slots_per_replica} }} }}]',
                  'scorers = [{ type = "least_inflight" }]', 'picker = { type = "max_score" }',
                  ""]  # fmt: skip
        lines += _tenant("app", priority=2, max_priority=0)
    lines.append("")
    for i, url in enumerate(urls):
        lines += ["[[replicas]]", f'url = "{url}"', f'name = "r{i}"', ""]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _fleet(p: Params, work: Path) -> AsyncIterator[list[SimReplica]]:
    replicas = [SimReplica(i, port, replace(SIM, seed=p.seed), work) for i, port in
                enumerate(free_ports(p.replicas))]  # fmt: skip
    try:
        await asyncio.gather(*(r.start() for r in replicas))
        yield replicas
    finally:
        await asyncio.gather(*(r.stop() for r in replicas))


@contextlib.asynccontextmanager
async def _gateway(p: Params, urls: list[str], part: str, work: Path) -> AsyncIterator[Gateway]:
    [port] = free_ports(1)
    (work / part).mkdir()
    gw = Gateway(gateway_toml(p, port, urls, part), port, work / part)
    try:
        await gw.start()
        yield gw
    finally:
        await gw.stop()


def _a_stats(answers: list[Answer]) -> dict[str, Any]:
    ttft = [a.ttft_s for a in answers if a.complete and a.ttft_s is not None]
    p50, p90 = pct(ttft, 0.5), pct(ttft, 0.9)
    return {"sent": len(answers), "ok": len(ttft), "errors": len(answers) - len(ttft),
            "ttft_p50_s": None if p50 is None else round(p50, 4),
            "ttft_p90_s": None if p90 is None else round(p90, 4)}  # fmt: skip


def _b_stats(answers: list[Answer]) -> dict[str, Any]:
    limits = Counter(
        next((w for w in ("requests_per_minute", "max_concurrent") if w in a.detail), "other")
        for a in answers
        if a.status == 429
    )
    ok = sum(a.complete for a in answers)
    return {"sent": len(answers), "ok": ok, "refused_by_limit": dict(sorted(limits.items())),
            "other": len(answers) - ok - sum(limits.values())}  # fmt: skip


async def isolation(p: Params, urls: list[str], work: Path) -> dict[str, Any]:
    rng = random.Random(p.seed)
    async with (
        _gateway(p, urls, "isolation", work) as gw,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s,
    ):

        def sender(key: str) -> Callable[[], Coroutine[Any, Any, Answer]]:
            return lambda: stream(s, gw.url, key, _prompt(rng, p.prompt_words), p.max_tokens)

        await open_loop(p.a_rate, min(5.0, p.phase_s), rng, sender("A-key"))  # warm-up
        before = await gateway_metrics(s, gw.url)
        phases: list[dict[str, Any]] = []
        pooled: dict[str, list[Answer]] = {"A": [], "A+B": []}
        b_rate = 10 * p.b_rpm / 60.0  # 10x its per-minute quota
        for name in ("A", "A+B", "A", "A+B"):
            runs = [open_loop(p.a_rate, p.phase_s, rng, sender("A-key"))]
            if name == "A+B":
                runs.append(open_loop(b_rate, p.phase_s, random.Random(rng.random()),
                                      sender("B-key")))  # fmt: skip
            got = await asyncio.gather(*runs)
            pooled[name] += got[0]
            row: dict[str, Any] = {"phase": name, "a": _a_stats(got[0])}
            if name == "A+B":
                row["b"] = _b_stats(got[1])
            phases.append(row)
            print(f"tenants: phase {name}: {row}", flush=True)
        after = await gateway_metrics(s, gw.url)
    alone, mixed = _a_stats(pooled["A"]), _a_stats(pooled["A+B"])
    ratio = None
    if alone["ttft_p90_s"] and mixed["ttft_p90_s"]:
        ratio = round(mixed["ttft_p90_s"] / alone["ttft_p90_s"], 4)
    name = "llm_gateway_quota_refusals_total"
    refusals = {k: int(v - by_label(before, name, "limit").get(k, 0))
                for k, v in by_label(after, name, "limit").items()}  # fmt: skip
    return {"b_rate": b_rate, "phases": phases, "a_alone": alone, "a_with_b": mixed,
            "a_alone_p90_s": alone["ttft_p90_s"], "a_with_b_p90_s": mixed["ttft_p90_s"],
            "p90_ratio": ratio, "b_quota_refusals": refusals}  # fmt: skip


async def priority(p: Params, urls: list[str], work: Path) -> dict[str, Any]:
    rng = random.Random(p.seed + 1)
    prompt = _prompt(rng, p.prompt_words)  # one bucket for every request of this part
    slots = p.slots_per_replica * len(urls)
    async with (
        _gateway(p, urls, "priority", work) as gw,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s,
    ):

        def send(cls: str, tokens: int = p.max_tokens) -> Coroutine[Any, Any, Answer]:
            return stream(s, gw.url, "app-key", prompt, tokens, **{"x-priority": cls})

        base = [(await send("P0")).ttft_s for _ in range(p.baseline_probes)]
        unqueued = statistics.median(t for t in base if t is not None)
        flood: list[Answer] = []
        stop = time.monotonic() + p.flood_s

        async def flooder(worker: int) -> None:
            # Lengths vary, so slots free at scattered times (equal ones free in lockstep).
            lengths = random.Random(p.seed * 1000 + worker)
            while time.monotonic() < stop:
                tokens = lengths.randint(p.max_tokens // 2, p.max_tokens * 3 // 2)
                flood.append(await send("P2", tokens))

        workers = [asyncio.create_task(flooder(w)) for w in range(slots + p.flood_queue)]
        await asyncio.sleep(min(2.0, p.flood_s / 4))  # the flood builds its queue first
        probes: list[Answer] = []
        while time.monotonic() < stop - 2 * p.probe_gap_s:
            probes.append(await send("P0"))
            # The probes' own pace, irregular: they arrive at every phase of the dispatches.
            await asyncio.sleep(rng.uniform(0.5, 1.5) * p.probe_gap_s)
        await asyncio.gather(*workers)
    # A request's dispatch = its first byte less the unqueued TTFT (one prompt for all).
    dispatches = sorted(a.sent_at + a.ttft_s - unqueued for a in flood if a.ttft_s is not None)
    done = [pr for pr in probes if pr.ttft_s is not None]
    window = [t for t in dispatches if done and done[0].sent_at <= t <= done[-1].sent_at]
    interval = (window[-1] - window[0]) / (len(window) - 1) if len(window) > 1 else None
    rows: list[dict[str, Any]] = []
    for pr in probes:
        row: dict[str, Any] = {"status": pr.status, "wait_s": None}
        if pr.ttft_s is not None and interval is not None:
            wait = max(0.0, pr.ttft_s - unqueued)
            n = sum(1 for t in dispatches if pr.sent_at < t < pr.sent_at + wait)
            row.update(wait_s=round(wait, 4), wait_slots=round(wait / interval, 3), p2_ahead=n)
        rows.append(row)
    waited: list[float] = [r["wait_slots"] for r in rows if r["wait_s"] is not None]
    ahead: list[int] = [r["p2_ahead"] for r in rows if r["wait_s"] is not None]
    return {"slots": slots, "unqueued_ttft_s": round(unqueued, 4),
            "dispatch_interval_s": None if interval is None else round(interval, 4),
            "flood_requests": len(flood), "flood_ok": sum(a.complete for a in flood),
            "probes": rows, "median_wait_slots": _r3(pct(waited, 0.5)),
            "max_wait_slots": max(waited, default=None),
            "median_p2_ahead": pct([float(x) for x in ahead], 0.5),
            "max_p2_ahead": max(ahead, default=None)}  # fmt: skip


async def measure(p: Params) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmgw-tenants-") as tmp:
        work = Path(tmp)
        async with _fleet(p, work) as replicas:
            urls = [r.url for r in replicas]
            iso = await isolation(p, urls, work)
            prio = await priority(p, urls, work)
    wall = round(time.monotonic() - started, 1)
    return {"parameters": p.to_json(), "isolation": iso, "priority": prio,
            "checks": checks(iso, prio), "wall_s": wall}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `llm-gateway bench tenants`."""
    parser.add_argument("--out", default="bench-out/tenants", help="output directory")
    parser.add_argument("--phase", type=float, default=20.0, help="seconds per isolation phase")
    parser.add_argument("--a-rate", type=float, default=8.0, help="tenant A's streams per second")
    parser.add_argument("--flood", type=float, default=20.0, help="seconds of P2 flood")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    """Entry point: 0 when every check passed."""
    p = Params(Path(args.out), phase_s=args.phase, a_rate=args.a_rate, flood_s=args.flood,
               seed=args.seed)  # fmt: skip
    meta = {"date": dt.date.today().isoformat(), "machine": machine_info(),
            "command": "llm-gateway " + shlex.join(sys.argv[1:])}  # fmt: skip
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = {"meta": meta, **runner.run(measure(p))}
    p.out.mkdir(parents=True, exist_ok=True)
    (p.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (p.out / "report.md").write_text(markdown(results))
    for c in results["checks"]:
        print(f"check {c['check']}: {c['value']} ({c['bound']}) {'ok' if c['passed'] else 'FAIL'}")
    print(f"wrote {p.out / 'results.json'} and {p.out / 'report.md'}")
    return 0 if all(c["passed"] for c in results["checks"]) else 1
