"""Open-loop Poisson load generator, run as its own process so its CPU is measured apart.

`python -m benchmarks.routing_bench.loadgen SPEC.json`: sends the workload's warm-up requests
(every group once) and waits for them, then steps through a ladder of rates, each for a fixed
time, with exponential inter-arrival gaps from a seeded generator; then drains in-flight requests
under a deadline. Every request becomes one JSONL record; phase boundaries are JSON lines on
stdout (the parent snapshots replica counters there); progress goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, replace
from typing import IO, Any

import aiohttp
import orjson

from benchmarks.routing_bench.workloads import BenchRequest, FleetSize, make_workload

_CONNECT_TIMEOUT_S = 5.0
_IDLE_TIMEOUT_S = 60.0  # longest silence between chunks before a stream counts as failed
_PROGRESS_EVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Everything one load-generator run needs; written by the parent as JSON."""

    url: str  # a base URL, or several joined by commas
    model: str
    workload: str
    seed: int
    size: tuple[int, int, int, float]  # replicas, blocks per replica, block size, word tokens
    rates: tuple[float, ...]
    step_s: float
    warmup_rate: float
    warmup_timeout_s: float
    drain_s: float
    out: str
    tag: str  # run label, prefixed to request ids so replicas' records can be joined
    overrides: dict[str, Any] | None = None
    headers: dict[str, str] | None = None  # the contender's own (e.g. LiteLLM's master key)
    # Warm-up outputs are cut to this: warm-up opens connections and places every group's
    # prefix once; long outputs there only cost time (None: the workload's own length).
    warmup_max_tokens: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadSpec:
        data = dict(data)
        data["size"] = tuple(data["size"])
        data["rates"] = tuple(data["rates"])
        return cls(**data)


def _event(kind: str, **fields: Any) -> None:
    print(json.dumps({"event": kind, "t": time.time(), **fields}), flush=True)


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    rec: dict[str, Any],
) -> None:
    """POST one streamed chat request; fill rec's status, ttft, gaps, e2e, usage and error.

    rec["sent"] is the send time TTFT and e2e count from; errors raise (aiohttp, timeouts).
    """
    t0 = float(rec["sent"])
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=_IDLE_TIMEOUT_S
    )
    headers["content-type"] = "application/json"
    async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
        rec["status"] = resp.status
        if resp.status != 200:
            rec["error"] = (await resp.text())[:200]
            return
        last = 0.0
        done = False
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            obj = orjson.loads(payload)
            if "error" in obj:
                rec["error"] = str(obj["error"])[:200]
                return
            now = time.time()
            for ch in obj.get("choices") or ():
                if (ch.get("delta") or {}).get("content"):
                    if rec["ttft"] is None:
                        rec["ttft"] = now - t0
                    else:
                        rec["gaps"].append(round(now - last, 6))
                    last = now
                    break
            usage = obj.get("usage")
            if usage:
                rec["tokens"] = usage.get("completion_tokens", 0)
                rec["prompt_tokens"] = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details") or {}
                rec["cached_tokens"] = details.get("cached_tokens")
        rec["e2e"] = time.time() - t0
        if not done:
            rec["error"] = "stream ended without [DONE]"
        elif rec["ttft"] is None:
            rec["error"] = "no content"


class _Run:
    def __init__(self, spec: LoadSpec, session: aiohttp.ClientSession, out: IO[bytes]) -> None:
        self.spec = spec
        # Several gateway "hosts" (comma-joined URLs): each request to the next, in turn.
        self.urls = spec.url.split(",")
        self.session = session
        self.out = out
        self.tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.done = 0
        self.lags: list[float] = []

    def launch(self, req: BenchRequest, phase: str, step: int, rate: float, sched: float) -> None:
        task = asyncio.create_task(self._one(req, phase, step, rate, sched))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _one(
        self, req: BenchRequest, phase: str, step: int, rate: float, sched: float
    ) -> None:
        spec = self.spec
        rid = f"{spec.tag}-{req.rid}"
        rec: dict[str, Any] = {
            "rid": rid,
            "phase": phase,
            "step": step,
            "rate": rate,
            "group": req.group,
            "sched": sched,
            "sent": 0.0,
            "ttft": None,
            "gaps": [],
            "e2e": None,
            "tokens": 0,
            "prompt_tokens": None,
            "cached_tokens": None,
            "status": 0,
            "error": None,
            "max_tokens": req.max_tokens,
        }
        headers = {**(spec.headers or {}), "x-request-id": rid}
        if req.session is not None:
            headers["x-session-id"] = req.session
        body = orjson.dumps(req.body(spec.model))
        self.sent += 1
        t0 = time.time()
        rec["sent"] = t0
        self.lags.append(t0 - sched)
        try:
            rec["host"] = host = self.sent % len(self.urls)
            url = self.urls[host]
            await stream_chat(self.session, f"{url}/v1/chat/completions", body, headers, rec)
        except asyncio.CancelledError:
            rec["error"] = rec["error"] or "cancelled at the drain deadline"
            self._write(rec)
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
        self._write(rec)

    def _write(self, rec: dict[str, Any]) -> None:
        self.done += 1
        self.out.write(orjson.dumps(rec) + b"\n")

    async def drain(self, deadline: float) -> bool:
        while self.tasks and time.time() < deadline:
            await asyncio.wait(list(self.tasks), timeout=max(0.0, deadline - time.time()))
        if not self.tasks:
            return True
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        return False


async def _progress(run: _Run, label: list[str]) -> None:
    while True:
        await asyncio.sleep(_PROGRESS_EVERY_S)
        lags = sorted(run.lags[-500:])
        p99 = lags[int(0.99 * (len(lags) - 1))] * 1000 if lags else 0.0
        print(
            f"  {run.spec.tag} {label[0]}: sent {run.sent} done {run.done} "
            f"in flight {len(run.tasks)} send lag p99 {p99:.1f} ms",
            file=sys.stderr,
            flush=True,
        )


async def _pace(run: _Run, reqs: list[BenchRequest], rate: float, phase: str) -> None:
    start = time.time()
    for i, req in enumerate(reqs):
        sched = start + i / rate
        await asyncio.sleep(max(0.0, sched - time.time()))
        run.launch(req, phase, -1, rate, sched)


async def run(spec: LoadSpec, out: IO[bytes]) -> int:
    """Warm-up, the rate ladder, the drain; returns the number of requests recorded."""
    size = FleetSize(*spec.size)
    wl = make_workload(spec.workload, size, spec.seed, spec.overrides)
    arrivals = random.Random(spec.seed + 7)
    label = ["warm-up"]
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        run = _Run(spec, session, out)
        prog = asyncio.create_task(_progress(run, label))
        try:
            cap = spec.warmup_max_tokens
            warm = [replace(r, max_tokens=min(r.max_tokens, cap)) if cap else r for r in wl.warmup]
            _event("warmup", requests=len(warm))
            await _pace(run, warm, spec.warmup_rate, "warmup")
            warmed = await run.drain(time.time() + spec.warmup_timeout_s)
            _event("warmup_done", complete=warmed)
            stream = wl.requests()
            t = time.time()
            for step, rate in enumerate(spec.rates):
                label[0] = f"step {step + 1}/{len(spec.rates)} ({rate:g} req/s)"
                end = t + spec.step_s
                _event("step", step=step, rate=rate)
                t += arrivals.expovariate(rate)
                while t < end:
                    await asyncio.sleep(max(0.0, t - time.time()))
                    run.launch(next(stream), "step", step, rate, t)
                    t += arrivals.expovariate(rate)
                t = end
                await asyncio.sleep(max(0.0, end - time.time()))
            _event("drain")
            label[0] = "drain"
            complete = await run.drain(time.time() + spec.drain_s)
            _event("done", complete=complete, requests=run.done)
        finally:
            prog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prog
    return run.done


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.routing_bench.loadgen SPEC.json", file=sys.stderr)
        return 2
    with open(args[0], "rb") as f:
        spec = LoadSpec.from_json(orjson.loads(f.read()))
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass
    with open(spec.out, "wb") as out:
        asyncio.run(run(spec, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
