"""What one GET /load costs a real vLLM replica's API server, next to one GET /metrics.

Run from the repository root (the CPU engine prepared: `python -m benchmarks.vllm_cpu prepare`),
alone on the machine, about 3 minutes:

    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.load_cost --out DIR

One replica of the test fleet's shape (as docs/vllm-cpu.md, "Cost of a /metrics scrape"). For
each condition (idle, then one stream running) and each round, blocks of `--requests`
sequential GETs of /load and of /metrics alternate, the order flipped every round. A block's
cost is the API-server process's utime + stime (/proc/<pid>/stat; the engine core is a child
and not counted) over it, less the process's rate over a quiet window just before the round,
per request; the client-side latency of every request is kept too. Prints a Markdown table;
`--out` also writes the raw figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.overhead_procs import cpu_seconds
from benchmarks.vllm_cpu.fleet import VllmFleet

ROUTES = ("/load", "/metrics")
QUIET_S = 3.0


@dataclass(frozen=True, slots=True)
class Block:
    """One block of sequential GETs of one route."""

    condition: str
    round: int
    route: str
    requests: int
    cpu_ms_per_request: float
    wall_ms_per_request: float
    latency_ms_p50: float
    latency_ms_p99: float
    body_bytes: int


async def _quiet_rate(pid: int) -> float:
    """CPU seconds per second of the API server with no request of ours."""
    before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(QUIET_S)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


async def _block(
    client: httpx.AsyncClient, pid: int, route: str, n: int, rate: float, cond: str, rnd: int
) -> Block:
    latencies: list[float] = []
    size = 0
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    for _ in range(n):
        sent = time.perf_counter()
        r = await client.get(route)
        latencies.append(time.perf_counter() - sent)
        r.raise_for_status()
        size = len(r.content)
    wall = time.monotonic() - t0
    cpu = cpu_seconds(pid) - cpu0 - rate * wall
    cuts = statistics.quantiles(latencies, n=100)
    return Block(
        cond,
        rnd,
        route,
        n,
        1000.0 * cpu / n,
        1000.0 * wall / n,
        1000.0 * statistics.median(latencies),
        1000.0 * cuts[98],
        size,
    )


async def _stream_forever(url: str, model: str) -> None:
    """Answers of 1984 tokens one after another (the 'one stream running' condition)."""
    body = {"model": model, "prompt": "count", "max_tokens": 1984, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=600.0) as c:
        while True:
            (await c.post("/v1/completions", json=body)).raise_for_status()


async def measure(rounds: int, requests: int) -> list[Block]:
    """Every block of both conditions on one fresh replica."""
    blocks: list[Block] = []
    async with VllmFleet(1, num_gpu_blocks=96, block_size=32, max_model_len=2048) as fleet:
        replica = fleet.replicas[0]
        async with httpx.AsyncClient(base_url=replica.url, timeout=30.0) as client:
            for route in ROUTES:  # warm both routes (first /metrics imports and renders)
                (await client.get(route)).raise_for_status()
            for cond in ("idle", "one stream"):
                streamer = None
                if cond == "one stream":
                    streamer = asyncio.create_task(_stream_forever(replica.url, fleet.model))
                    await asyncio.sleep(2.0)  # past its prefill
                try:
                    for rnd in range(rounds):
                        rate = await _quiet_rate(replica.pid)
                        order = ROUTES if rnd % 2 == 0 else ROUTES[::-1]
                        for route in order:
                            blocks.append(
                                await _block(client, replica.pid, route, requests, rate, cond, rnd)
                            )
                        if streamer is not None and streamer.done():
                            streamer.result()  # a stream that failed fails the run
                finally:
                    if streamer is not None:
                        streamer.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await streamer
    return blocks


def table(blocks: list[Block]) -> str:
    """Markdown: per condition and route, each round's CPU and the latencies."""
    lines = [
        "| condition | route | CPU per request (ms), each round | wall per request (ms) "
        "| latency p50 / p99 (ms) | body |",
        "|---|---|---|---|---|---|",
    ]
    for cond in dict.fromkeys(b.condition for b in blocks):
        for route in ROUTES:
            mine = [b for b in blocks if b.condition == cond and b.route == route]
            cpu = ", ".join(f"{b.cpu_ms_per_request:.2f}" for b in mine)
            wall = ", ".join(f"{b.wall_ms_per_request:.2f}" for b in mine)
            lat = ", ".join(f"{b.latency_ms_p50:.2f} / {b.latency_ms_p99:.2f}" for b in mine)
            lines.append(
                f"| {cond} | `{route}` | {cpu} | {wall} | {lat} | {mine[-1].body_bytes} B |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="GETs per block")
    parser.add_argument("--out", type=Path, default=None, help="directory for blocks.json")
    args = parser.parse_args()
    blocks = asyncio.run(measure(args.rounds, args.requests))
    print(table(blocks))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        raw = [asdict(b) for b in blocks]
        (args.out / "blocks.json").write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
