"""Capacity of the simulator itself: replicas x concurrent streams one process sustains.

The fleet runs in a child process (`python -m simulator`); the load generator (aiohttp
streams, closed loop) runs in this process, so the two do not share an event loop. Distortion
per request = measured at the client / modelled by the replica's step clock (from
/_sim/timings, joined on X-Request-Id), for TTFT and mean inter-token latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.procs import stop_process

PROMPT_WORDS = 200  # ~250 builtin tokens: a short, realistic prefill per request


@dataclass(frozen=True, slots=True)
class RunResult:
    replicas: int
    streams: int
    time_scale: float
    stream_interval: int
    duration_s: float
    requests: int
    chunks_per_s: float
    tokens_per_s: float
    sim_cpu_frac: float
    client_cpu_frac: float
    ttft_distortion_p50: float
    ttft_distortion_p90: float
    itl_distortion_p50: float
    itl_distortion_p90: float
    itl_distortion_mean: float
    modelled_itl_ms_p50: float
    measured_itl_ms_p50: float
    engine_ttft_distortion_p50: float
    engine_ttft_distortion_p90: float
    engine_itl_distortion_p50: float
    engine_itl_distortion_p90: float


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _start_fleet(
    replicas: int, time_scale: float, interval: int
) -> tuple[asyncio.subprocess.Process, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "--replicas", str(replicas), "--base-port", "0",
        "--time-scale", str(time_scale), "--stream-interval", str(interval),
        "--kv-events", "false", "--max-num-seqs", "1024",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    urls: list[str] = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
        if not line:
            raise RuntimeError("simulator exited before it was ready")
        if line == "ready":
            return proc, urls
        urls.append(line.split()[1])


async def _worker(
    s: aiohttp.ClientSession, url: str, wid: int, stop_at: float, max_tokens: int,
    out: list[tuple[str, float, float, int, int]],
) -> None:  # fmt: skip
    n = 0
    while time.monotonic() < stop_at:
        rid = f"w{wid}-{n}"
        n += 1
        prompt = f"client {wid} request {n} " + "lorem ipsum dolor sit amet " * (PROMPT_WORDS // 5)
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        t0 = time.monotonic()
        first = last = 0.0
        chunks = 0
        timeout = aiohttp.ClientTimeout(total=120, sock_read=30)
        async with s.post(
            f"{url}/v1/completions", json=body, headers={"X-Request-Id": rid}, timeout=timeout
        ) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    last = time.monotonic()
                    if chunks == 0:
                        first = last
                    chunks += 1
        out.append((f"cmpl-{rid}", first - t0, last - first, chunks, max_tokens))


async def _run(
    replicas: int, streams: int, time_scale: float, duration: float, max_tokens: int,
    interval: int,
) -> RunResult:  # fmt: skip
    proc, urls = await _start_fleet(replicas, time_scale, interval)
    try:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            out: list[tuple[str, float, float, int, int]] = []
            cpu0, me0, t0 = _cpu_seconds(proc.pid), time.process_time(), time.monotonic()
            stop_at = t0 + duration
            await asyncio.gather(
                *(_worker(s, urls[i % len(urls)], i, stop_at, max_tokens, out)
                  for i in range(streams))
            )  # fmt: skip
            wall = time.monotonic() - t0
            cpu = _cpu_seconds(proc.pid) - cpu0
            me = time.process_time() - me0
            modelled: dict[str, list[Any]] = {}
            for url in urls:
                async with s.get(f"{url}/_sim/timings") as resp:
                    for rec in orjson.loads(await resp.read()):
                        modelled[rec[0]] = rec
    finally:
        await stop_process(proc)
    ttft_d: list[float] = []
    itl_d: list[float] = []
    m_itl: list[float] = []
    c_itl: list[float] = []
    # Delivered by the engine vs modelled: the simulator's own overhead, without the client's.
    e_ttft = [m[4] / m[2] for m in modelled.values() if m[2] > 0]
    e_itl = [m[5] / m[3] for m in modelled.values() if m[3] > 0]
    for rid, ttft, span, chunks, tokens in out:
        m = modelled.get(rid)
        if m is None or chunks < 2:
            continue
        ttft_d.append(ttft / m[2])
        # With stream_interval k the client sees chunks; spread the span over the tokens.
        measured_itl = span / (tokens - 1) if tokens > 1 else 0.0
        if m[3] > 0:
            itl_d.append(measured_itl / m[3])
            m_itl.append(m[3] * 1000)
            c_itl.append(measured_itl * 1000)
    total_chunks = sum(c for _, _, _, c, _ in out)
    return RunResult(
        replicas=replicas,
        streams=streams,
        time_scale=time_scale,
        stream_interval=interval,
        duration_s=round(wall, 2),
        requests=len(out),
        chunks_per_s=round(total_chunks / wall, 1),
        tokens_per_s=round(sum(t for *_, t in out) / wall, 1),
        sim_cpu_frac=round(cpu / wall, 3),
        client_cpu_frac=round(me / wall, 3),
        ttft_distortion_p50=round(_pct(ttft_d, 0.5), 4),
        ttft_distortion_p90=round(_pct(ttft_d, 0.9), 4),
        itl_distortion_p50=round(_pct(itl_d, 0.5), 4),
        itl_distortion_p90=round(_pct(itl_d, 0.9), 4),
        itl_distortion_mean=round(statistics.fmean(itl_d), 4) if itl_d else float("nan"),
        modelled_itl_ms_p50=round(_pct(m_itl, 0.5), 3),
        measured_itl_ms_p50=round(_pct(c_itl, 0.5), 3),
        engine_ttft_distortion_p50=round(_pct(e_ttft, 0.5), 4),
        engine_ttft_distortion_p90=round(_pct(e_ttft, 0.9), 4),
        engine_itl_distortion_p50=round(_pct(e_itl, 0.5), 4),
        engine_itl_distortion_p90=round(_pct(e_itl, 0.9), 4),
    )


def _markdown(results: list[RunResult]) -> str:
    head = (
        "# Simulator capacity (simulated vLLM fleet, one process; load generator in a separate "
        "process)\n\n| replicas | streams | time scale | interval | req | chunks/s | tokens/s "
        "| sim CPU | client CPU | TTFT dist p50/p90 | ITL dist p50/p90 | ITL ms model/meas "
        "| engine TTFT dist p50/p90 | engine ITL dist p50/p90 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r.replicas} | {r.streams} | {r.time_scale:g} | {r.stream_interval} | {r.requests} "
        f"| {r.chunks_per_s:.0f} | {r.tokens_per_s:.0f} | {r.sim_cpu_frac:.2f} "
        f"| {r.client_cpu_frac:.2f} | {r.ttft_distortion_p50:.3f}/{r.ttft_distortion_p90:.3f} "
        f"| {r.itl_distortion_p50:.3f}/{r.itl_distortion_p90:.3f} "
        f"| {r.modelled_itl_ms_p50:.2f}/{r.measured_itl_ms_p50:.2f} "
        f"| {r.engine_ttft_distortion_p50:.3f}/{r.engine_ttft_distortion_p90:.3f} "
        f"| {r.engine_itl_distortion_p50:.3f}/{r.engine_itl_distortion_p90:.3f} |"
        for r in results
    ]
    note = (
        "\n\nDistortion = measured / modelled (1.0 = none): 'TTFT/ITL dist' measured at the "
        "client (includes HTTP and the client's own CPU), 'engine' = when the replica delivered "
        "the token vs its modelled deadline (the simulator's own overhead). CPU = cores used.\n"
    )
    return head + "\n".join(rows) + note


async def _main(args: argparse.Namespace) -> list[RunResult]:
    if args.quick:
        grid = [(16, 256)]
        duration = 4.0
    else:
        grid = [(4, 64), (16, 256), (16, 512), (32, 512)]
        duration = args.duration
    results = []
    for scale in args.time_scales:
        for replicas, streams in grid:
            r = await _run(replicas, streams, scale, duration, args.max_tokens, args.interval)
            print(json.dumps(asdict(r)), flush=True)
            results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the grid; write results.json and results.md under --out."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_capacity", description=__doc__)
    p.add_argument("--quick", action="store_true", help="16 replicas x 256 streams only, 4 s")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per run (full mode)")
    p.add_argument("--time-scales", type=float, nargs="+", default=[1.0, 10.0])
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--interval", type=int, default=1, help="stream interval (tokens/chunk)")
    p.add_argument("--out", default="bench-out/sim_capacity", help="output directory")
    args = p.parse_args(argv)
    results = asyncio.run(_main(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    (out / "results.md").write_text(_markdown(results))
    print(_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
