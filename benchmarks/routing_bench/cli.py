"""`llm-gateway bench routing [--quick] [--fleet sim|vllm-cpu] [--out DIR]`."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.routing_bench.fleet import FleetError, SimParams
from benchmarks.routing_bench.gateway_contender import BUILTIN_MODES
from benchmarks.routing_bench.goodput import DEFAULT_SLOS
from benchmarks.routing_bench.suite import SuiteConfig, run_suite
from benchmarks.routing_bench.workloads import WORKLOADS, FleetSize, WorkloadError, make_workload

# Offered loads (requests/s) per workload. The simulated fleet (8 replicas) keeps up with
# about 16 req/s of shared-prefix traffic without cache affinity and well beyond with it.
FULL_RATES: dict[str, tuple[float, ...]] = {
    # Nobody queues at 20 req/s of equally popular groups; the knee is at 35-45.
    "shared_prefix": (30.0, 35.0, 40.0, 45.0),
    # Zipf popularity: the hot groups outgrow their holder from about 20 req/s.
    "skewed_prefix": (20.0, 30.0, 40.0),
    "generated_shared_prefix": (12.0, 24.0),
    "multi_round_chat": (12.0, 24.0),
    "low_sharing": (8.0, 16.0),
    "bimodal": (12.0, 24.0),
}
# The profiles the targets name; quick mode runs only these of ours (and every peer).
QUICK_GATEWAY = ("round_robin", "precise", "default")
# Real vLLM on CPU: a tiny model with a 1,024-token context, a few requests/s at most.
VLLM_CPU_RATES: dict[str, tuple[float, ...]] = dict.fromkeys(FULL_RATES, (0.5, 1.0, 2.0))
# In workload words: the tiny model's tokenizer makes ~3.4 tokens of each, and every prompt
# plus its output must fit the 1,024-token context.
VLLM_CPU_SIZES: dict[str, dict[str, Any]] = {
    "shared_prefix": {"prefix": 160, "question": 24, "output": 32},
    "skewed_prefix": {"prefix": 160, "question": 24, "output": 32},
    "generated_shared_prefix": {"prefix": 96, "question": 16, "output": 32},
    "multi_round_chat": {"system": 48, "question": 16, "answer": 16, "turns": 4},
    "low_sharing": {"prompt": 96, "output": 32},
    "bimodal": {"short_in": 24, "short_out": 16, "long_in": 200, "long_out": 64},
}
QUICK_RATES: dict[str, tuple[float, ...]] = {"shared_prefix": (8.0, 24.0), "low_sharing": (16.0,)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `llm-gateway bench routing`."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="shared-prefix and low-sharing, short steps, our round_robin/precise/default only",
    )
    parser.add_argument(
        "--fleet",
        choices=("sim", "vllm-cpu"),
        default="sim",
        help="simulated replicas (default) or real vLLM CPU replicas",
    )
    parser.add_argument(
        "--out", default=None, help="output folder (default: bench-out/routing-<date>)"
    )
    parser.add_argument(
        "--workloads", default=None, help=f"comma-separated subset of: {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--rates", default=None, help="comma-separated offered loads (req/s) for every workload"
    )
    parser.add_argument(
        "--step-s", type=float, default=None, help="seconds per offered load (default 5, quick 3)"
    )
    parser.add_argument(
        "--gateway",
        default=None,
        help="comma-separated gateway profiles to run (default: all of "
        f"{', '.join(m.label for m in BUILTIN_MODES)})",
    )
    parser.add_argument(
        "--peers", default=None, help="comma-separated peer contenders to run (default: all)"
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="run our gateway only (peers are listed as not run)"
    )
    parser.add_argument(
        "--custom-profiles",
        default=None,
        help="TOML with [routing.profiles.X] tables: each X runs approximate and precise (+kv)",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="TOML with [variants.NAME] tables (profile, precise, toml = text appended to the "
        "gateway's config): each runs as contender gateway:NAME",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    parser.add_argument(
        "--seeds",
        help="comma-separated seeds, each a full run of every workload (default: --seed); "
        "the report folds them (median, mean success) and shows the per-seed spread",
    )
    parser.add_argument(
        "--seeds-for",
        help="comma-separated workloads that run every seed (default: all); the others run "
        "the first seed only",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="run seed by seed, every contender in turn on each (each seed starting with the "
        "next), each started afresh: the machine's drift over the run falls on all alike",
    )
    parser.add_argument("--replicas", type=int, default=None, help="fleet size (sim 8, vllm-cpu 2)")
    parser.add_argument(
        "--num-gpu-blocks",
        type=int,
        default=None,
        help="KV blocks per replica (sim 1024, vllm-cpu 96)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=None,
        metavar="WORKLOAD.KEY=VALUE",
        help="set one workload parameter, e.g. shared_prefix.popularity=1 (repeatable)",
    )
    parser.add_argument(
        "--slo",
        default=None,
        help="comma-separated TTFT p90 SLOs in seconds for the report's goodput (default: "
        + ",".join(f"{s:g}" for s in DEFAULT_SLOS)
        + ")",
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator clock speed-up")
    parser.add_argument("--stream-interval", type=int, default=8, help="tokens per SSE chunk")


def config_from_args(args: argparse.Namespace) -> SuiteConfig:
    vllm = args.fleet == "vllm-cpu"
    rates = QUICK_RATES if args.quick else FULL_RATES
    names = args.workloads.split(",") if args.workloads else list(rates)
    seeded = args.seeds_for.split(",") if args.seeds_for else []
    unknown = [n for n in (*names, *seeded) if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workloads: {', '.join(unknown)}")
    ladder = {n: (VLLM_CPU_RATES if vllm else rates).get(n, FULL_RATES[n]) for n in names}
    if args.rates:
        fixed = tuple(float(x) for x in args.rates.split(","))
        ladder = dict.fromkeys(names, fixed)
    slos = _slos(args.slo) if getattr(args, "slo", None) else DEFAULT_SLOS
    block = 32 if vllm else 16
    sim = SimParams(
        replicas=args.replicas or (2 if vllm else 8),
        num_gpu_blocks=args.num_gpu_blocks or (96 if vllm else 1024),
        block_size=block,
        time_scale=args.time_scale,
        stream_interval=args.stream_interval,
        seed=args.seed,
    )
    labels = (
        tuple(args.gateway.split(",")) if args.gateway else QUICK_GATEWAY if args.quick else None
    )
    date = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = Path(args.out) if args.out else Path("bench-out") / f"routing-{date}"
    return SuiteConfig(
        out=out,
        fleet=args.fleet,
        sim=sim,
        workloads=ladder,
        step_s=args.step_s or (3.0 if args.quick else 5.0),
        warmup_timeout_s=20.0 if args.quick else 30.0,
        # Longer than any answer takes at the top rates unless the contender is overloaded.
        drain_s=8.0 if args.quick else 10.0,
        seeds=tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (args.seed,),
        seeds_for=tuple(args.seeds_for.split(",")) if args.seeds_for else None,
        gateway_labels=labels,
        custom_profiles=Path(args.custom_profiles) if args.custom_profiles else None,
        variants=Path(args.variants) if args.variants else None,
        with_peers=not args.no_peers,
        peers=tuple(args.peers.split(",")) if args.peers else None,
        overrides=_overrides(names, vllm, args.param or ()),
        command=_command(args),
        slos=slos,
        interleave=args.interleave,
    )


def _slos(text: str) -> tuple[float, ...]:
    """--slo 1,2: positive seconds, or a ValueError before any fleet starts."""
    try:
        slos = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--slo {text!r}: expected comma-separated seconds, e.g. 1,2") from None
    if not all(s > 0 for s in slos):
        raise ValueError(f"--slo {text!r}: every SLO must be > 0 seconds")
    return slos


def _overrides(names: list[str], vllm: bool, params: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each workload's parameters: the vllm-cpu sizes, then every --param on top."""
    out: dict[str, dict[str, Any]] = {n: dict(VLLM_CPU_SIZES[n]) for n in names} if vllm else {}
    for item in params:
        key, sep, raw = item.partition("=")
        wl, dot, name = key.partition(".")
        if not (sep and dot and name) or wl not in WORKLOADS:
            raise ValueError(f"--param {item!r}: expected WORKLOAD.KEY=VALUE with a known workload")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(wl, {})[name] = value
    for wl, given in out.items():
        try:  # a typo fails here, before any fleet starts
            make_workload(wl, FleetSize(1, 64, 16), 0, given)
        except WorkloadError as exc:
            raise ValueError(str(exc)) from None
    return out


_OPTIONS = ("quick", "fleet", "out", "workloads", "rates", "step_s", "gateway", "peers", "no_peers",
            "custom_profiles", "variants", "seed", "seeds", "seeds_for", "param", "replicas",
            "num_gpu_blocks", "time_scale", "stream_interval", "slo", "interleave")  # fmt: skip


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run."""
    parts = ["llm-gateway", "bench", "routing"]
    for name in _OPTIONS:
        v = getattr(args, name, None)
        flag = "--" + name.replace("_", "-")
        if v is True:
            parts.append(flag)
        elif isinstance(v, list):
            for item in v:
                parts += [flag, str(item)]
        elif v not in (None, False):
            parts += [flag, str(v)]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 when the report was written, 2 on bad options or a fleet failure."""
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass
    try:
        asyncio.run(run_suite(cfg))
    except FleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {cfg.out / 'report.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway bench routing", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
