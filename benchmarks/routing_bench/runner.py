"""One contender x one workload: cold caches, the load generator, counters and CPU sampled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.overhead_procs import cpu_seconds
from benchmarks.routing_bench.fleet import (
    HITS,
    PREEMPTIONS,
    QUERIES,
    RUNNING,
    WAITING,
    RunningFleet,
    replica_of_requests,
    reset_caches,
    scrape,
)
from benchmarks.routing_bench.loadgen import LoadSpec
from benchmarks.routing_bench.stats import Snapshot, step_row

_REPO = Path(__file__).resolve().parents[2]
_IDLE_TIMEOUT_S = 60.0


class RunError(Exception):
    """A run could not be carried out (load generator failed, fleet stuck busy)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Rates and durations of one contender x workload run (identical for every contender)."""

    rates: tuple[float, ...]
    step_s: float
    warmup_rate: float
    warmup_timeout_s: float
    drain_s: float
    seed: int
    sample_s: float = 0.5
    warmup_max_tokens: int | None = None


def machine_busy_s() -> float:
    """CPU seconds all processes on this machine spent busy so far (from /proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _cpu(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += cpu_seconds(pid)
    return total


class _Monitor:
    """Samples per-replica running requests on a period; snapshots counters on demand."""

    def __init__(
        self, session: aiohttp.ClientSession, fleet: RunningFleet, groups: dict[str, list[int]]
    ) -> None:
        self.session = session
        self.urls = fleet.info.urls
        self.groups = groups
        self.running: list[tuple[float, list[float]]] = []

    async def snapshot(self) -> Snapshot:
        t = time.time()
        cpu = {k: _cpu(p) for k, p in self.groups.items()}
        with contextlib.suppress(OSError, ValueError):
            cpu["machine"] = machine_busy_s()
        m = await scrape(self.session, self.urls)
        return Snapshot(
            t,
            sum(x[HITS] for x in m),
            sum(x[QUERIES] for x in m),
            cpu,
            sum(x[PREEMPTIONS] for x in m),
        )

    async def sample(self, period: float) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                m = await scrape(self.session, self.urls)
                self.running.append((time.time(), [x[RUNNING] for x in m]))
            await asyncio.sleep(period)  # a sampling period, not synchronisation


async def wait_idle(session: aiohttp.ClientSession, urls: tuple[str, ...]) -> None:
    """Until no replica runs or queues anything (left-overs of the previous run)."""
    deadline = time.monotonic() + _IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        m = await scrape(session, urls)
        if all(x[RUNNING] == 0 and x[WAITING] == 0 for x in m):
            return
        await asyncio.sleep(0.2)  # polling a condition under a deadline
    raise RunError(f"fleet still busy after {_IDLE_TIMEOUT_S:g} s")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    return env


async def run_one(
    session: aiohttp.ClientSession,
    fleet: RunningFleet,
    contender: str,
    base_url: str,
    contender_pids: list[int],
    workload: str,
    plan: Plan,
    work: Path,
    overrides: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    tag_suffix: str = "",
) -> list[dict[str, Any]]:
    """Run the workload's warm-up and rate ladder through `base_url`; one row per rate."""
    await wait_idle(session, fleet.info.urls)
    await reset_caches(session, fleet.info.urls)
    tag = f"{contender.replace(':', '_')}-{workload}{tag_suffix}"
    jsonl = work / f"{tag}.jsonl"
    spec = LoadSpec(
        url=base_url,
        model=fleet.info.model,
        workload=workload,
        seed=plan.seed,
        size=(
            fleet.size.replicas,
            fleet.size.blocks_per_replica,
            fleet.size.block_size,
            fleet.size.word_tokens,
        ),
        rates=plan.rates,
        step_s=plan.step_s,
        warmup_rate=plan.warmup_rate,
        warmup_timeout_s=plan.warmup_timeout_s,
        drain_s=plan.drain_s,
        out=str(jsonl),
        tag=tag,
        overrides=overrides,
        headers=headers,
        warmup_max_tokens=plan.warmup_max_tokens,
    )
    spec_path = work / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.routing_bench.loadgen",
        str(spec_path),
        stdout=asyncio.subprocess.PIPE,
        env=_env(),
        cwd=_REPO,
    )
    assert proc.stdout is not None
    groups = {"fleet": fleet.pids(), "contender": contender_pids, "loadgen": [proc.pid]}
    mon = _Monitor(session, fleet, groups)
    sampler = asyncio.create_task(mon.sample(plan.sample_s))
    marks: list[Snapshot] = []
    warm_ok = True
    limit = plan.warmup_timeout_s + len(plan.rates) * plan.step_s + plan.drain_s + 60.0
    try:
        async with asyncio.timeout(limit):
            while line := await proc.stdout.readline():
                ev = json.loads(line)
                if ev["event"] in ("step", "drain"):
                    marks.append(await mon.snapshot())
                elif ev["event"] == "warmup_done":
                    warm_ok = bool(ev["complete"])
            rc = await proc.wait()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    if rc != 0 or len(marks) != len(plan.rates) + 1:
        raise RunError(f"load generator for {tag} failed (exit {rc}, {len(marks)} marks)")
    records = [orjson.loads(x) for x in jsonl.read_bytes().splitlines() if x]
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        where = await replica_of_requests(session, fleet.info.urls)
        for r in records:
            r["replica"] = where.get(r["rid"])
        jsonl.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    rows = []
    for k, rate in enumerate(plan.rates):
        a, b = marks[k], marks[k + 1]
        mine = [r for r in records if r["phase"] == "step" and r["step"] == k]
        running = [s for t, s in mon.running if a.t <= t < b.t]
        row = {
            "contender": contender,
            "workload": workload,
            "offered_qps": rate,
            "fleet": fleet.info.fleet,
            "status": "ok",
            "warmup_complete": warm_ok,
        }
        row.update(step_row(mine, a, b, running, records))
        row["replicas_used"] = len({r.get("replica") for r in mine if r.get("replica") is not None})
        rows.append(row)
    return rows
