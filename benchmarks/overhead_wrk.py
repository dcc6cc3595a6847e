"""`bench overhead --harness wrk`: the gateway measured as the field measures routers.

wrk (one thread) -> target -> nginx serving fixed vLLM-shaped replies (benchmarks.nginx_upstream).
Targets, interleaved in every round of every (stream, concurrency) cell: direct to nginx, each
gateway build (`--gateway NAME=DIR`: `llm-gateway serve` run from that source tree, default
config plus the one nginx replica; default: this checkout), then the peer routers. Gateways and
peers are started per stream setting (nginx answers JSON and SSE on two ports). CPU per request
is the target process's own utime + stime (/proc/<pid>/stat) over the wrk run, divided by the
requests wrk completed.

results.json: `machine`, `parameters`, `peers` (as the Python harness), `rows` (per target,
concurrency, stream: medians over rounds of rps, p50_ms, p90_ms, p99_ms, cpu_us_per_request,
upstream_cpu_us_per_request (nginx), and of per-round differences against the paired direct
round: added_p50_ms, added_p99_ms, rps_ratio_vs_direct; chunks_per_s = rps x (deltas + 1) on
streamed rows; requests, errors summed), `targets` (issue 17's), `rounds` (every round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.nginx_upstream import Nginx, nginx
from benchmarks.overhead_procs import (
    PeerRun,
    _Child,
    _spawn_in,
    cpu_seconds,
    cpu_seconds_of,
    free_ports,
    machine_info,
    not_run,
    peer_routers,
    runqueue_wait_s,
    wait_ready,
)
from benchmarks.overhead_report import write_results
from benchmarks.overhead_wrk_report import (
    DIRECT,
    RUST_PEERS,
    WrkRound,
    build_rows,
    evaluate_targets,
    markdown,
    round_figures,
)
from benchmarks.procs import descendants
from benchmarks.routing_bench.contenders import FleetInfo
from benchmarks.static_upstream import MODEL
from benchmarks.wrk_load import WrkError, lua_script, request_body, run_wrk

HOST = "127.0.0.1"
_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class WrkParams:
    """One wrk-harness run's settings."""

    out: Path
    concurrency: tuple[int, ...]
    rounds: int
    duration_s: float
    warmup_s: float
    stream_chunks: int
    gateways: tuple[tuple[str, Path, int], ...]  # name, source tree, workers
    peers: tuple[str, ...]
    peers_off: bool = False
    streams: tuple[bool, ...] = (False, True)


def parse_gateway(spec: str) -> tuple[str, Path, int]:
    """`NAME=DIR` (a source tree with gateway/ in it) for --gateway; `NAME=DIR@N`: N workers."""
    name, sep, rest = spec.partition("=")
    path, _, workers = rest.rpartition("@") if "@" in rest else (rest, "", "1")
    src = Path(path).expanduser().resolve()
    if not sep or not name or not (src / "gateway" / "cli.py").is_file():
        raise ValueError(f"--gateway wants NAME=DIR with DIR/gateway/cli.py: {spec!r}")
    if not workers.isdigit() or int(workers) < 1:
        raise ValueError(f"--gateway NAME=DIR@N wants N >= 1 workers: {spec!r}")
    return name, src, int(workers)


def gateway_toml(port: int, upstream_url: str) -> str:
    """The default configuration plus its port and the one nginx replica."""
    return (
        f'[server]\nhost = "{HOST}"\nport = {port}\ndrain_timeout_s = 1.0\n\n'
        f'[[replicas]]\nurl = "{upstream_url}"\nname = "nginx"\n'
    )


@dataclass(frozen=True, slots=True)
class _Gateway:
    name: str
    port: int
    pid: int


@contextlib.asynccontextmanager
async def gateways(
    builds: Sequence[tuple[str, Path, int]], upstream_url: str, work: Path
) -> AsyncIterator[list[_Gateway]]:
    """One gateway process per build in front of `upstream_url`; all stopped on exit."""
    children: list[_Child] = []
    try:
        out: list[_Gateway] = []
        for name, src, workers in builds:
            (port,) = free_ports(HOST, 1)
            cfg = work / f"{name}.toml"
            cfg.write_text(gateway_toml(port, upstream_url))
            log = work / f"{name}.log"
            args = ["gateway.cli", "--log-level", "warning", "serve", "-c", str(cfg)]
            args += ["--workers", str(workers)] if workers > 1 else []
            with log.open("wb") as f:
                proc = await _spawn_in(src, args, f)
            children.append(_Child(f"gateway {name}", proc, log))
            await wait_ready(f"gateway {name}", proc, log, HOST, port, "/ready")
            out.append(_Gateway(name, port, proc.pid))
        yield out
        for child in children:
            child.check_alive()
    finally:
        for child in reversed(children):
            await child.stop()


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> tuple[float, float]:
    """CPU seconds the machine spent in processes (user, nice, system), and stolen by its host."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # Not irq/softirq: loopback TCP is processed there for everyone, attributed to no process.
    user, nice, system, steal = fields[0], fields[1], fields[2], fields[7]
    return (user + nice + system) / _CLK_TCK, steal / _CLK_TCK


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


async def _measure_one(
    target: str, url: str, pids: Sequence[int], ng: Nginx, script: Path, conc: int, dur: float
) -> WrkRound:
    """One wrk run; the CPU of the target, nginx, wrk (a reaped child) and everyone else."""
    cpu0, up0, wait0 = cpu_seconds_of(pids), cpu_seconds(ng.pid), runqueue_wait_s(pids)
    kids0, own0, (busy0, steal0) = _children_cpu_s(), time.process_time(), machine_busy_s()
    result = await run_wrk(url, script, conc, dur)
    busy1, steal1 = machine_busy_s()
    busy = busy1 - busy0
    cpu, up = cpu_seconds_of(pids) - cpu0, cpu_seconds(ng.pid) - up0
    wait = runqueue_wait_s(pids) - wait0
    wrk = _children_cpu_s() - kids0
    others = max(0.0, busy - cpu - up - wrk - (time.process_time() - own0))
    return WrkRound(target, conc, False, -1, result, cpu, up, wrk, others, steal1 - steal0, wait)


async def _phase(
    p: WrkParams, ng: Nginx, stream: bool, work: Path, peer_runs: list[PeerRun]
) -> list[WrkRound]:
    upstream = ng.url(stream)
    script = work / f"chat-{stream}.lua"
    script.write_text(lua_script(request_body(MODEL, stream), {}))
    info = FleetInfo((upstream,), MODEL, (None,), None, 16, "static")
    out: list[WrkRound] = []
    async with (
        gateways(p.gateways, upstream, work) as gws,
        peer_routers(p.peers, info) as peers,
    ):
        if not peer_runs:
            peer_runs.extend(peers)  # as they started in the first phase
        targets: list[tuple[str, str, list[int]]] = [(DIRECT, upstream, [])]
        # A supervisor's workers are its children: their CPU is the gateway's.
        targets += [(g.name, f"http://{HOST}:{g.port}", [g.pid, *descendants(g.pid)]) for g in gws]
        for peer in peers:
            if peer.running and peer.contender is not None:
                targets.append(
                    (peer.name, f"http://{peer.host}:{peer.port}", peer.contender.pids())
                )
        for conc in p.concurrency:
            if p.warmup_s > 0:
                for _, url, pids in targets:
                    await _measure_one("", url + "/v1/chat/completions", pids, ng, script, conc,
                                       p.warmup_s)  # fmt: skip
            for index in range(p.rounds):
                for name, url, pids in targets:
                    try:
                        one = await _measure_one(
                            name, url + "/v1/chat/completions", pids, ng, script, conc,
                            p.duration_s,
                        )  # fmt: skip
                    except WrkError as exc:
                        print(f"{name} c={conc} stream={stream}: {exc}", flush=True)
                        continue
                    one = replace(one, stream=stream, round=index)
                    out.append(one)
                    res, cpu = one.wrk, one.cpu_s
                    print(
                        f"c={conc:<3} stream={stream!s:<5} round {index} {name:<26} "
                        f"{res.rps:>8.0f} req/s p50 {res.p50_s * 1e3:.3f} ms "
                        f"p99 {res.p99_s * 1e3:.3f} ms {cpu / max(res.requests, 1) * 1e6:.0f} "
                        f"CPU us/req errors {res.errors} others' CPU "
                        f"{one.others_cpu_s / res.duration_s:.2f} steal "
                        f"{one.steal_s / res.duration_s:.2f} run-queue wait "
                        f"{one.wait_s / res.duration_s:.2f}",
                        flush=True,
                    )
    return out


async def measure(p: WrkParams) -> dict[str, Any]:
    """Every cell, every round; results.json's object."""
    machine = machine_info()
    rounds: list[WrkRound] = []
    peer_runs: list[PeerRun] = []
    with tempfile.TemporaryDirectory(prefix="llm-gw-wrk-") as tmp:
        async with nginx(HOST, p.stream_chunks) as ng:
            for stream in p.streams:
                rounds += await _phase(p, ng, stream, Path(tmp), peer_runs)
    if p.peers_off:
        peer_runs = not_run(RUST_PEERS, "--no-peers")
    rows = build_rows(rounds, p.stream_chunks)
    params = asdict(p)
    params["out"] = str(p.out)
    params["gateways"] = [[n, str(s), w] for n, s, w in p.gateways]
    return {
        "machine": machine,
        "parameters": params,
        "peers": [peer.as_json() for peer in peer_runs],
        "rows": rows,
        "targets": evaluate_targets(rows, p.gateways[0][0]),
        "rounds": [
            {
                "target": r.target,
                "concurrency": r.concurrency,
                "stream": r.stream,
                "round": r.round,
                "requests": r.wrk.requests,
                "errors": r.wrk.errors,
                "duration_s": r.wrk.duration_s,
                **{k: round(v, 4) for k, v in round_figures(r, p.stream_chunks).items()},
            }
            for r in rounds
        ],
    }


def params_from_args(args: argparse.Namespace) -> WrkParams:
    """The wrk harness's settings from `bench overhead`'s options."""
    quick = bool(args.quick)
    rounds = args.rounds if args.rounds is not None else (1 if quick else 2)
    duration = args.duration if args.duration is not None else (2.0 if quick else 10.0)
    warmup = args.warmup if args.warmup is not None else min(duration, 2.0)
    if rounds < 1 or duration < 1 or warmup < 0 or args.stream_chunks < 2:
        raise ValueError("wrk harness: need rounds >= 1, duration >= 1 s, warmup >= 0, chunks >= 2")
    if args.no_peers and args.peers:
        raise ValueError("--peers and --no-peers together")
    peers = RUST_PEERS if args.peers is None else tuple(n for n in args.peers.split(",") if n)
    builds = (
        tuple(parse_gateway(s) for s in args.gateway) if args.gateway else (("gateway", _REPO, 1),)
    )
    streams = {"both": (False, True), "no": (False,), "yes": (True,)}[args.stream]
    return WrkParams(
        Path(args.out), tuple(args.concurrency), rounds, duration, warmup, args.stream_chunks,
        builds, () if args.no_peers else peers, bool(args.no_peers), streams,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """`bench overhead --harness wrk`: 0 when every request succeeded."""
    p = params_from_args(args)
    results = asyncio.run(measure(p))
    write_results(results, p.out, markdown(results))
    print(markdown(results))
    print(f"wrote {p.out / 'results.json'} and {p.out / 'report.md'}")
    return 0 if sum(r["errors"] for r in results["rows"]) == 0 else 1
