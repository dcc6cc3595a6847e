"""`llm-gateway bench overhead`: the gateway's own cost against a direct connection.

Processes: a static vLLM-shaped upstream (benchmarks.static_upstream), one gateway (`llm-gateway
serve`, uvloop, default routing and metrics, gRPC front end on), this process as a closed-loop raw
HTTP/1.1 load generator (benchmarks.loadgen_http), and grpc.aio client workers
(benchmarks.loadgen_grpc). For each (concurrency, streamed) cell it runs a warm-up, then
interleaved rounds A (direct to the upstream over HTTP), B (through the gateway over HTTP) and C
(through the gateway over gRPC: Chat, or StreamChat when streamed, with the same request), each
with fresh connections, and reports medians over rounds. The upstream speaks only HTTP, so the
gRPC rows' baseline is the direct HTTP round: their `added_*` figures include the protocol change.

results.json schema:
- `machine`: cpu_model, cpu_count, cpus_usable, loadavg_at_start, platform, python, versions.
- `parameters`: out, concurrency, rounds, duration_s, warmup_s, stream_chunks, stream_gap_ms,
  grpc_clients (gRPC client processes), grpc_channels (channels, i.e. HTTP/2 connections, over
  all of them; never more than the concurrency).
- `rows`: one per (target, concurrency, stream), medians over rounds:
  - `target` "direct" | "gateway" (HTTP) | "gateway-grpc"; `concurrency` (requests in flight:
    HTTP connections with one each, or gRPC calls spread over the channels); `stream` (SSE
    answer, or StreamChat); `rounds`; `requests` (completed in the windows) and `errors` (any
    non-200 or non-OK status, broken stream or lost connection), `error_kinds`;
  - `rps`; `p50_ms`, `p99_ms`: latency from sending the request to its last byte;
  - `added_p50_ms`, `added_p99_ms`, `rps_ratio_vs_direct`: median over rounds of the gateway
    round minus (divided by) the direct HTTP round it was interleaved with (0 and 1 on direct
    rows);
  - `cpu_us_per_request`: gateway process CPU per request (on direct rows: the idle gateway's
    health checks, ~0); `upstream_cpu_us_per_request`, `loadgen_cpu_us_per_request` (the
    client: this process on HTTP rows, the gRPC worker processes together on gRPC rows);
  - `gateway_cpu_util`, `upstream_cpu_util`, `loadgen_cpu_util`: CPU seconds per wall second;
  - streams only, else null: `chunks_per_s` (received per second: SSE events incl. [DONE] over
    HTTP, i.e. stream_chunks + 1 per answer; ChatChunk messages over gRPC, stream_chunks per
    answer as [DONE] has no message), `http_chunks_per_s` (HTTP/1.1 chunks, i.e. writes of
    whoever answered; null on gRPC rows), `ttfc_p50_ms` (time to the first chunk or message)
    and `added_ttfc_p50_ms`.
- `targets`: name, field, threshold, comparison, unit, value, passed (null when not measured).
- `rounds`: every round's own figures.

`run` returns 0 when every request succeeded, 1 otherwise (targets never change the exit code).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from benchmarks import loadgen_grpc
from benchmarks.loadgen_grpc import GrpcLoadgen, grpc_loadgen
from benchmarks.loadgen_http import chat_request, run_round
from benchmarks.overhead_procs import Fleet, fleet, machine_info
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
)
from benchmarks.static_upstream import MODEL

_HOST = "127.0.0.1"
# Interleaved in this order in every round.
_ROUND_ORDER = (DIRECT, GATEWAY, GATEWAY_GRPC)


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


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be >= 1")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bench overhead` options."""
    parser.add_argument("--out", default="bench-out/overhead", help="output directory")
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
    )


async def _cell(
    f: Fleet, clients: GrpcLoadgen, p: Params, conc: int, stream: bool
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

    if p.warmup_s > 0:
        for target in _ROUND_ORDER:
            await one(target, p.warmup_s, -1)
    out: list[Measured] = []
    for index in range(p.rounds):
        for target in _ROUND_ORDER:
            out.append(await one(target, p.duration_s, index))
    return out


async def measure(p: Params) -> dict[str, Any]:
    """Run every cell against a fresh upstream and gateway; return the results.json object."""
    machine = machine_info()
    measured: list[Measured] = []
    async with (
        fleet(_HOST, p.stream_chunks, p.stream_gap_ms) as f,
        grpc_loadgen(p.grpc_clients) as clients,
    ):
        for stream in (False, True):
            for conc in p.concurrency:
                cell = await _cell(f, clients, p, conc, stream)
                measured += cell
                for gw in build_rows(cell):
                    if gw["target"] == DIRECT:
                        continue
                    print(
                        f"c={conc:<3} stream={stream!s:<5} {gw['target']:<12} "
                        f"{gw['rps']:>8.0f} req/s (x{gw['rps_ratio_vs_direct']:.2f} of direct) "
                        f"+p50 {gw['added_p50_ms']:.3f} ms "
                        f"{gw['cpu_us_per_request']:.0f} CPU us/req errors {gw['errors']}",
                        flush=True,
                    )
    rows = build_rows(measured)
    params = asdict(p)
    params["out"] = str(p.out)
    params["concurrency"] = list(p.concurrency)
    return {
        "machine": machine,
        "parameters": params,
        "rows": rows,
        "targets": evaluate_targets(rows),
        "rounds": rounds_json(measured),
    }


def write_outputs(results: dict[str, Any], out: Path) -> None:
    """results.json and report.md under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    schema = __doc__.split("results.json schema:", 1)[1] if __doc__ else ""
    (out / "report.md").write_text(render_markdown(results, schema))


def run(args: argparse.Namespace) -> int:
    """Entry point of `llm-gateway bench overhead`."""
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
    print(f"wrote {p.out / 'results.json'} and {p.out / 'report.md'}")
    errors = sum(r["errors"] for r in results["rows"])
    return 0 if errors == 0 else 1
