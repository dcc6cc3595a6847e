"""`llm-gateway bench faults`: the fault suite's options and entry point."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shlex
import sys
from pathlib import Path

import uvloop

from benchmarks.faults.clients import LoadSettings
from benchmarks.faults.report import write_outputs
from benchmarks.faults.suite import Params, measure
from benchmarks.overhead_procs import machine_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `llm-gateway bench faults`."""
    parser.add_argument("--out", default="bench-out/faults", help="output directory")
    parser.add_argument("--streams", type=int, default=200, help="concurrent clients (200)")
    parser.add_argument("--duration", type=float, default=100.0, help="seconds of load (100)")
    parser.add_argument("--replicas", type=int, default=4, help="simulated replicas (4)")
    parser.add_argument("--slowloris", type=int, default=256, help="slowloris connections (256)")
    parser.add_argument("--deadline", type=float, default=60.0, help="per-request deadline, s")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts and clients")


def params_from_args(args: argparse.Namespace) -> Params:
    if args.streams < 1 or args.duration <= 0 or args.replicas < 2 or args.slowloris < 1:
        raise ValueError("--streams and --slowloris must be >= 1, --replicas >= 2, --duration > 0")
    load = LoadSettings(
        concurrency=args.streams,
        duration_s=args.duration,
        deadline_s=args.deadline,
        seed=args.seed,
    )
    return Params(
        out=Path(args.out),
        replicas=args.replicas,
        load=load,
        slowloris_connections=args.slowloris,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point: 0 when every check passed (nothing lost, in-flight back to 0, ...)."""
    try:
        p = params_from_args(args)
    except ValueError as exc:
        print(f"bench faults: {exc}", file=sys.stderr)
        return 2
    meta = {
        "date": dt.date.today().isoformat(),
        "command": "llm-gateway " + shlex.join(sys.argv[1:]),
        "machine": machine_info(),
    }
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
