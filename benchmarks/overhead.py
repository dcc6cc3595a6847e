"""`llm-gateway bench overhead`: the gateway's own cost against a direct connection, and peers'.

Processes: a static vLLM-shaped upstream (benchmarks.static_upstream), one gateway (`llm-gateway
serve`, uvloop, default routing and metrics, gRPC front end on), this process as a closed-loop raw
HTTP/1.1 load generator (benchmarks.loadgen_http), and grpc.aio client workers
(benchmarks.loadgen_grpc). For each (concurrency, streamed) cell it runs a warm-up, then
interleaved rounds A (direct to the upstream over HTTP), B (through the gateway over HTTP) and C
(through the gateway over gRPC: Chat, or StreamChat when streamed, with the same request), each
with fresh connections, and reports medians over rounds. The upstream speaks only HTTP, so the
gRPC rows' baseline is the direct HTTP round: their `added_*` figures include the protocol change.

Peer routers (benchmarks.routing_bench.peers; by default sglang:round_robin,
vllm-router:round_robin and litellm:least-busy, each's cheapest policy as there is one upstream)
start once in front of the same upstream and take their turn in the same rounds, after C. Each
learns its SSE event count per answer in its warm-up (a peer may re-frame the stream) and is held
to it after. A peer's window is `duration_s`, stretched to twice its warm-up's wall time (at most
4 x duration_s) so that a slow peer completes whole requests in it; LiteLLM runs only
`litellm_rounds` rounds per cell (paired with the first direct rounds) to bound the run's time.

results.json schema:
- `machine`: cpu_model, cpu_count, cpus_usable, loadavg_at_start, platform, python, versions.
- `parameters`: out, concurrency, rounds, duration_s, warmup_s, stream_chunks, stream_gap_ms,
  grpc_clients (gRPC client processes), grpc_channels (channels, i.e. HTTP/2 connections, over
  all of them; never more than the concurrency), peers (names asked for), litellm_rounds.
- `peers`: one per peer asked for (or, with --no-peers, the default ones): name, policy,
  version (installed, or null), status ("run", "not run: <reason>", or "stopped: <reason>" when
  it failed mid-run and its later cells are missing), events_per_answer (SSE events incl.
  [DONE] it relayed per streamed answer).
- `rows`: one per (target, concurrency, stream), medians over rounds:
  - `target` "direct" | "gateway" (HTTP) | "gateway-grpc" | a peer's name; `concurrency`
    (requests in flight: HTTP connections with one each, or gRPC calls spread over the
    channels); `stream` (SSE answer, or StreamChat); `rounds`; `requests` (completed in the
    windows) and `errors` (any non-200 or non-OK status, broken stream or lost connection),
    `error_kinds`;
  - `rps`; `p50_ms`, `p99_ms`: latency from sending the request to its last byte;
  - `added_p50_ms`, `added_p99_ms`, `rps_ratio_vs_direct`: median over rounds of the gateway's
    (or peer's) round minus (divided by) the direct HTTP round it was interleaved with (0 and 1
    on direct rows);
  - `cpu_us_per_request`: CPU per request of the proxy under test: the gateway process, or the
    peer's process(es) on peer rows (on direct rows: the idle gateway's health checks, ~0);
    `upstream_cpu_us_per_request`, `loadgen_cpu_us_per_request` (the client: this process on
    HTTP rows, the gRPC worker processes together on gRPC rows);
  - `gateway_cpu_util` (the proxy under test, as above), `upstream_cpu_util`,
    `loadgen_cpu_util`: CPU seconds per wall second;
  - streams only, else null: `chunks_per_s` (received per second: SSE events incl. [DONE] over
    HTTP, i.e. stream_chunks + 1 per answer or a peer's events_per_answer; ChatChunk messages
    over gRPC, stream_chunks per answer as [DONE] has no message), `http_chunks_per_s`
    (HTTP/1.1 chunks, i.e. writes of whoever answered; null on gRPC rows), `ttfc_p50_ms` (time
    to the first chunk or message) and `added_ttfc_p50_ms`.
- `targets`: name, field, threshold, comparison, unit, value, passed (null when not measured).
- `rounds`: every round's own figures.

`run` returns 0 when every request succeeded, peers' included, 1 otherwise (targets and peers
that did not run never change the exit code).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvloop

from benchmarks import loadgen_grpc, overhead_wrk
from benchmarks.loadgen_grpc import GrpcLoadgen, grpc_loadgen
from benchmarks.loadgen_http import LoadgenError, RoundResult, chat_request, run_round
from benchmarks.nginx_upstream import nginx_binary
from benchmarks.overhead_procs import (
    Fleet,
    PeerRun,
    fleet,
    fleet_info,
    machine_info,
    not_run,
    peer_routers,
)
from benchmarks.overhead_report import (
    DIRECT,
    GATEWAY,
    GATEWAY_GRPC,
    Measured,
    build_rows,
    evaluate_targets,
    markdown_table,
    render_markdown,
    rounds_json,
    write_results,
)
from benchmarks.routing_bench.peers import CATALOGUE
from benchmarks.static_upstream import MODEL
from benchmarks.wrk_load import wrk_binary

_HOST = "127.0.0.1"
# Interleaved in this order in every round, the peers after them.
_ROUND_ORDER = (DIRECT, GATEWAY, GATEWAY_GRPC)
# The cheapest policy of each: with one upstream there is nothing for a smarter one to pick.
DEFAULT_PEERS = ("sglang:round_robin", "vllm-router:round_robin", "litellm:least-busy")
# A slow peer's drain at c=64 streamed takes seconds: this bounds it, not the window.
_PEER_DRAIN_S = 30.0


@dataclass(frozen=True, slots=True)
class Params:
    """One benchmark run's settings."""

    out: Path
    concurrency: tuple[int, ...]
    rounds: int
    duration_s: float
    warmup_s: float
    stream_chunks: int
    stream_gap_ms: float
    grpc_clients: int = 2
    grpc_channels: int = 4
    peers: tuple[str, ...] = ()
    litellm_rounds: int = 1
    peers_off: bool = False  # --no-peers: DEFAULT_PEERS are listed as not run


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be >= 1")
    return values


def _default_harness() -> str:
    return "wrk" if wrk_binary() and nginx_binary() else "python"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bench overhead` options."""
    parser.add_argument("--out", default="bench-out/overhead", help="output directory")
    parser.add_argument(
        "--harness",
        choices=("wrk", "python"),
        help="wrk -> target -> nginx (default when both are installed; HTTP only), or this "
        "process's generator against the Python static upstream (HTTP and gRPC)",
    )
    parser.add_argument(
        "--gateway",
        action="append",
        metavar="NAME=DIR",
        help="wrk harness: a gateway build to measure, run from source tree DIR (repeatable; "
        "default: this checkout as `gateway`); the first is the one held to the targets",
    )
    parser.add_argument(
        "--stream",
        choices=("both", "no", "yes"),
        default="both",
        help="wrk harness: non-streamed and/or streamed cells (default both)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="1 round of 1.5 s per cell (defaults: 3 x 3 s)"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per target and cell")
    parser.add_argument("--duration", type=float, help="seconds per round")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up per target and cell")
    parser.add_argument(
        "--concurrency", type=_concurrency, default=(1, 16, 64), help="e.g. 1,16,64 (default)"
    )
    parser.add_argument(
        "--stream-chunks", type=int, default=64, help="SSE deltas per streamed answer (>= 2)"
    )
    parser.add_argument(
        "--stream-gap-ms",
        type=float,
        default=0.0,
        help="upstream pause between SSE deltas (default 0: as fast as its event loop turns)",
    )
    parser.add_argument(
        "--grpc-clients", type=int, default=2, help="gRPC load generator processes (default 2)"
    )
    parser.add_argument(
        "--grpc-channels", type=int, default=4, help="gRPC channels over all of them (default 4)"
    )
    parser.add_argument(
        "--peers",
        help=f"comma-separated peer routers (default: {','.join(DEFAULT_PEERS)}; "
        "any not installed is listed as not run)",
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="no peer routers (listed as not run)"
    )
    parser.add_argument(
        "--litellm-rounds",
        type=int,
        default=1,
        help="rounds per cell for LiteLLM, ~100x slower than the others (default 1)",
    )


def params_from_args(args: argparse.Namespace) -> Params:
    """Resolve --quick and the explicit overrides."""
    quick = bool(args.quick)
    rounds = args.rounds if args.rounds is not None else (1 if quick else 3)
    duration = args.duration if args.duration is not None else (1.5 if quick else 3.0)
    warmup = args.warmup if args.warmup is not None else min(duration, 1.0)
    chunks, gap = args.stream_chunks, args.stream_gap_ms
    if rounds < 1 or duration <= 0 or warmup < 0 or chunks < 2 or gap < 0:
        raise ValueError("need rounds >= 1, duration > 0, warmup >= 0, chunks >= 2, gap >= 0")
    if args.grpc_clients < 1 or args.grpc_channels < 1:
        raise ValueError("need --grpc-clients >= 1 and --grpc-channels >= 1")
    if args.litellm_rounds < 1:
        raise ValueError("need --litellm-rounds >= 1")
    if args.no_peers and args.peers:
        raise ValueError("--peers and --no-peers together")
    peers = DEFAULT_PEERS if args.peers is None else tuple(n for n in args.peers.split(",") if n)
    known = [c[0] for c in CATALOGUE]
    unknown = [n for n in peers if n not in known]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return Params(
        Path(args.out),
        tuple(args.concurrency),
        rounds,
        duration,
        warmup,
        chunks,
        gap,
        args.grpc_clients,
        args.grpc_channels,
        () if args.no_peers else peers,
        args.litellm_rounds,
        bool(args.no_peers),
    )


def _peer_rounds(peer: PeerRun, p: Params) -> int:
    return min(p.rounds, p.litellm_rounds) if peer.name.startswith("litellm:") else p.rounds


async def _peer_round(
    f: Fleet, peer: PeerRun, conc: int, stream: bool, duration: float
) -> RoundResult:
    assert peer.contender is not None
    request = chat_request(peer.host, peer.port, MODEL, stream, peer.contender.headers)

    def snapshot() -> dict[str, float]:
        # The "gateway" figure is the proxy under test's: here the peer's process(es).
        return {**f.cpu_snapshot(), "gateway": peer.cpu_seconds()}

    return await run_round(
        peer.host,
        peer.port,
        request,
        concurrency=conc,
        duration_s=duration,
        stream=stream,
        expect_events=peer.events_per_answer,
        cpu_snapshot=snapshot,
        timeout_s=_PEER_DRAIN_S,
    )


async def _cell(
    f: Fleet,
    clients: GrpcLoadgen,
    peers: list[PeerRun],
    p: Params,
    conc: int,
    stream: bool,
) -> list[Measured]:
    ports = {DIRECT: f.upstream_port, GATEWAY: f.gateway_port}
    requests = {t: chat_request(f.host, port, MODEL, stream) for t, port in ports.items()}
    grpc_request = loadgen_grpc.chat_request(MODEL)

    async def one(target: str, duration: float, index: int) -> Measured:
        if target == GATEWAY_GRPC:
            result = await clients.run_round(
                f"{f.host}:{f.grpc_port}",
                grpc_request,
                concurrency=conc,
                channels=p.grpc_channels,
                duration_s=duration,
                stream=stream,
                expect_messages=p.stream_chunks,
                cpu_snapshot=f.cpu_snapshot,
            )
            return Measured(target, conc, stream, index, result)
        result = await run_round(
            f.host,
            ports[target],
            requests[target],
            concurrency=conc,
            duration_s=duration,
            stream=stream,
            expect_events=p.stream_chunks + 1,
            cpu_snapshot=f.cpu_snapshot,
        )
        return Measured(target, conc, stream, index, result)

    async def peer_one(peer: PeerRun, duration: float, index: int) -> Measured | None:
        if not peer.running:
            return None
        try:
            result = await _peer_round(f, peer, conc, stream, duration)
        except LoadgenError as exc:
            peer.status = f"stopped: at c={conc} stream={stream}: {exc}"
            return None
        if stream and result.events_per_answer is not None:
            peer.events_per_answer = result.events_per_answer
        return Measured(peer.name, conc, stream, index, result)

    windows: dict[str, float] = {}
    if p.warmup_s > 0:
        for target in _ROUND_ORDER:
            await one(target, p.warmup_s, -1)
        for peer in peers:
            t0 = time.perf_counter()
            await peer_one(peer, p.warmup_s, -1)
            # Warm-up wall time includes its drain, so ~ one request's latency at this load.
            wall = time.perf_counter() - t0
            windows[peer.name] = min(max(p.duration_s, 2 * wall), 4 * p.duration_s)
    out: list[Measured] = []
    for index in range(p.rounds):
        for target in _ROUND_ORDER:
            out.append(await one(target, p.duration_s, index))
        for peer in peers:
            if index < _peer_rounds(peer, p):
                m = await peer_one(peer, windows.get(peer.name, p.duration_s), index)
                if m is not None:
                    out.append(m)
    return out


async def measure(p: Params) -> dict[str, Any]:
    """Run every cell against a fresh upstream, gateway and peers; return results.json's object."""
    machine = machine_info()
    measured: list[Measured] = []
    peer_runs = not_run(DEFAULT_PEERS, "--no-peers") if p.peers_off else []
    async with (
        fleet(_HOST, p.stream_chunks, p.stream_gap_ms) as f,
        grpc_loadgen(p.grpc_clients) as clients,
        peer_routers(p.peers, fleet_info(f)) as peers,
    ):
        peer_runs += peers
        for peer in peers:
            print(f"peer {peer.name} {peer.version or ''}: {peer.status}", flush=True)
        for stream in (False, True):
            for conc in p.concurrency:
                running = [peer for peer in peers if peer.running]
                cell = await _cell(f, clients, running, p, conc, stream)
                measured += cell
                for gw in build_rows(cell):
                    if gw["target"] == DIRECT:
                        continue
                    print(
                        f"c={conc:<3} stream={stream!s:<5} {gw['target']:<24} "
                        f"{gw['rps']:>8.0f} req/s (x{gw['rps_ratio_vs_direct']:.2f} of direct) "
                        f"+p50 {gw['added_p50_ms']:.3f} ms "
                        f"{gw['cpu_us_per_request']:.0f} CPU us/req errors {gw['errors']}",
                        flush=True,
                    )
    rows = build_rows(measured)
    params = asdict(p)
    params["out"] = str(p.out)
    params["concurrency"] = list(p.concurrency)
    params["peers"] = list(p.peers)
    del params["peers_off"]
    return {
        "machine": machine,
        "parameters": params,
        "peers": [peer.as_json() for peer in peer_runs],
        "rows": rows,
        "targets": evaluate_targets(rows),
        "rounds": rounds_json(measured),
    }


def write_outputs(results: dict[str, Any], out: Path) -> None:
    """results.json and report.md under `out`."""
    schema = __doc__.split("results.json schema:", 1)[1] if __doc__ else ""
    write_results(results, out, render_markdown(results, schema))


def run(args: argparse.Namespace) -> int:
    """Entry point of `llm-gateway bench overhead`."""
    if (args.harness or _default_harness()) == "wrk":
        try:
            return overhead_wrk.run(args)
        except ValueError as exc:
            print(f"bench overhead: {exc}", file=sys.stderr)
            return 2
    try:
        p = params_from_args(args)
    except ValueError as exc:
        print(f"bench overhead: {exc}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(measure(p))
    write_outputs(results, p.out)
    print(markdown_table(results["rows"]))
    for t in results["targets"]:
        verdict = {True: "pass", False: "MISS", None: "not measured"}[t["passed"]]
        print(f"target {t['name']}: {t['comparison']} {t['threshold']:g} -> {t['value']} {verdict}")
    for peer in results["peers"]:
        print(f"peer {peer['name']}: {peer['status']}")
    print(f"wrote {p.out / 'results.json'} and {p.out / 'report.md'}")
    errors = sum(r["errors"] for r in results["rows"])
    return 0 if errors == 0 else 1
