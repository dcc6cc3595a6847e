"""The whole benchmark: one fleet, each contender in turn (or seed by seed), then the report."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.overhead_procs import machine_info
from benchmarks.routing_bench.aggregate import fold_seeds
from benchmarks.routing_bench.contenders import Contender, ContenderUnavailable
from benchmarks.routing_bench.fleet import RunningFleet, SimParams, start_sim, start_vllm_cpu
from benchmarks.routing_bench.gateway_contender import GatewayMode, gateway_contenders
from benchmarks.routing_bench.goodput import DEFAULT_SLOS
from benchmarks.routing_bench.plots import iter_plots
from benchmarks.routing_bench.report import render_markdown, write_report
from benchmarks.routing_bench.runner import Plan, RunError, run_one
from benchmarks.routing_bench.workloads import make_workload

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SuiteConfig:
    """What `llm-gateway bench routing` runs."""

    out: Path
    fleet: str = "sim"
    sim: SimParams = field(default_factory=SimParams)
    workloads: dict[str, tuple[float, ...]] = field(default_factory=dict)  # name -> rates
    step_s: float = 6.0
    warmup_rate: float = 40.0  # warm-up answers are short (warmup_max_tokens); send them fast
    warmup_timeout_s: float = 30.0
    warmup_max_tokens: int | None = 16  # warm-up outputs are cut to this (None: not cut)
    drain_s: float = 15.0
    seeds: tuple[int, ...] = (0,)  # each workload runs once per seed; rows are folded
    seeds_for: tuple[str, ...] | None = None  # workloads run on every seed (None: all)
    gateway_labels: tuple[str, ...] | None = None  # None: every built-in profile
    custom_profiles: Path | None = None
    variants: Path | None = None  # [variants.NAME] gateway configurations, see variant_modes
    with_peers: bool = True
    peers: tuple[str, ...] | None = None  # None: every peer
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # workload -> sizes
    command: str = ""
    slos: tuple[float, ...] = DEFAULT_SLOS  # TTFT p90 SLOs (s) the report's goodput is read at
    interleave: bool = False  # seed by seed, every contender in turn, each started per seed


def custom_modes(path: Path) -> tuple[GatewayMode, ...]:
    """`[routing.profiles.X]` tables of a TOML file: each X as approximate and as precise."""
    text = path.read_text()
    names = sorted(tomllib.loads(text).get("routing", {}).get("profiles", {}))
    return tuple(
        GatewayMode(f"{n}{suffix}", n, precise, text)
        for n in names
        for suffix, precise in (("", False), ("+kv", True))
    )


def variant_modes(path: Path) -> tuple[GatewayMode, ...]:
    """`[variants.NAME]` tables: one gateway contender each, the same traffic side by side.

    Keys: `profile` (default "default"), `precise` (KV events; default false), `toml`
    (text appended to the generated configuration, e.g. a `[score_loop]` table), `workers`
    and `hosts` (processes in all, over how many listen addresses; default 1 and 1),
    `shared_state` (the processes share state through a Redis started for them) and `source`
    (another checkout the gateway runs from, e.g. a snapshot of the build before a change).
    """
    variants = tomllib.loads(path.read_text()).get("variants", {})
    modes = []
    for name, v in sorted(variants.items()):
        unknown = sorted(
            set(v) - {"profile", "precise", "toml", "workers", "hosts", "shared_state", "source"}
        )
        if unknown:
            raise ValueError(f"{path}: variants.{name}: unknown keys {', '.join(unknown)}")
        modes.append(
            GatewayMode(
                name,
                str(v.get("profile", "default")),
                bool(v.get("precise")),
                str(v.get("toml", "")),
                workers=int(v.get("workers", 1)),
                hosts=int(v.get("hosts", 1)),
                shared_state=bool(v.get("shared_state")),
                source=str(v.get("source", "")),
            )
        )
    return tuple(modes)


def _contenders(cfg: SuiteConfig) -> tuple[list[Contender], list[dict[str, Any]]]:
    extra = custom_modes(cfg.custom_profiles) if cfg.custom_profiles else ()
    if cfg.variants is not None:
        extra = (*extra, *variant_modes(cfg.variants))
    labels = list(cfg.gateway_labels) if cfg.gateway_labels is not None else None
    out: list[Contender] = list(gateway_contenders(labels, extra))
    missing: list[dict[str, Any]] = []
    if cfg.with_peers:
        try:
            from benchmarks.routing_bench.peers import (
                CATALOGUE,
                NOT_BY_DEFAULT,
                peer_contenders,
                peer_names,
            )
        except ImportError as exc:
            missing.append(
                {
                    "contender": "peers",
                    "status": "unavailable",
                    "reason": f"peers module missing ({exc})",
                }
            )
        else:
            chosen = list(cfg.peers) if cfg.peers is not None else None
            out += list(peer_contenders(chosen))
            ran = set(peer_names(chosen))
            missing += [
                {
                    "contender": name,
                    "status": "not selected",
                    "reason": NOT_BY_DEFAULT.get(name, "not selected (--peers)"),
                }
                for name, *_ in CATALOGUE
                if name not in ran
            ]
    return out, missing


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _down(
    name: str, workloads: Sequence[str], fleet: str, status: str, reason: str
) -> list[dict[str, Any]]:
    return [
        {
            "contender": name,
            "workload": w,
            "offered_qps": None,
            "fleet": fleet,
            "status": status,
            "reason": reason,
        }
        for w in workloads
    ]


async def _start_fleet(cfg: SuiteConfig) -> RunningFleet:
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.fleet == "sim":
        return await start_sim(cfg.sim, cfg.out / "sim.log")
    if cfg.fleet == "vllm-cpu":
        return await start_vllm_cpu(cfg.sim.replicas, cfg.sim.num_gpu_blocks, cfg.sim.block_size)
    raise ValueError(f"unknown fleet {cfg.fleet!r}")


async def run_suite(cfg: SuiteConfig) -> list[dict[str, Any]]:
    """Run everything and write results.json, report.md and plots into cfg.out."""
    t_start = time.monotonic()
    machine = machine_info()
    contenders, missing = _contenders(cfg)
    names = list(cfg.workloads)
    rows = [
        x
        for m in missing
        for x in _down(m["contender"], names, cfg.fleet, m["status"], m["reason"])
    ]
    raw = cfg.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    fleet = await _start_fleet(cfg)
    try:
        async with aiohttp.ClientSession() as session:
            if cfg.interleave:
                for wl in names:
                    for k, seed in enumerate(_seeds(cfg, wl)):
                        # Each seed starts with the next contender: none always runs first.
                        turn = k % len(contenders) if contenders else 0
                        for c in [*contenders[turn:], *contenders[:turn]]:
                            rows += await _run_contender(cfg, session, fleet, c, [(wl, seed)], raw)
            else:
                for c in contenders:
                    runs = [(wl, seed) for wl in names for seed in _seeds(cfg, wl)]
                    rows += await _run_contender(cfg, session, fleet, c, runs, raw)
    finally:
        await fleet.stop()
    size = fleet.size
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": cfg.command,
        "seeds": list(cfg.seeds),
        "slos": list(cfg.slos),
        "seeds_for": list(cfg.seeds_for) if cfg.seeds_for is not None else list(cfg.workloads),
        "machine": machine,
        "fleet": {
            **fleet.params,
            "model": fleet.info.model,
            "replica_kv_tokens": size.replica_tokens,
            "fleet_kv_tokens": size.fleet_tokens,
        },
        "plan": {
            "rates": {k: list(v) for k, v in cfg.workloads.items()},
            "step_s": cfg.step_s,
            "warmup_rate": cfg.warmup_rate,
            "warmup_timeout_s": cfg.warmup_timeout_s,
            "warmup_max_tokens": cfg.warmup_max_tokens,
            "drain_s": cfg.drain_s,
        },
        "workloads": _workload_meta(cfg, fleet),
        "contenders": [c.name for c in contenders],
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    folded = fold_seeds(rows)
    write_outputs(cfg.out, meta, folded, rows, simulated=cfg.fleet == "sim")
    return folded


def write_outputs(
    out: Path,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    seed_rows: Sequence[Mapping[str, Any]],
    simulated: bool,
) -> list[Path]:
    """results.json and report.md, then the plots; return the plots that were written."""
    # The rows took the whole run to measure: they reach the disk before matplotlib runs, so a
    # plotting failure (a missing backend, a bad value) costs the figures and nothing else.
    write_report(out, meta, rows, [], seed_rows=seed_rows)
    plots: list[Path] = []
    try:
        for path in iter_plots(rows, out, simulated):
            plots.append(path)
    except Exception:
        log.exception(
            "plotting failed after %d plot(s); results.json and report.md are in %s",
            len(plots),
            out,
        )
    if plots:
        md = render_markdown(meta, rows, [p.name for p in plots], seed_rows)
        (out / "report.md").write_text(md)
    return plots


def _seeds(cfg: SuiteConfig, workload: str) -> tuple[int, ...]:
    """Every seed for the workloads named by seeds_for (all by default), else the first."""
    if cfg.seeds_for is None or workload in cfg.seeds_for:
        return cfg.seeds
    return cfg.seeds[:1]


async def _run_seed(
    cfg: SuiteConfig,
    session: aiohttp.ClientSession,
    fleet: RunningFleet,
    c: Contender,
    url: str,
    wl: str,
    seed: int,
    raw: Path,
) -> list[dict[str, Any]]:
    """One contender x workload x seed: its rows, or one "failed" row with the reason."""
    plan = Plan(
        cfg.workloads[wl],
        cfg.step_s,
        cfg.warmup_rate,
        cfg.warmup_timeout_s,
        cfg.drain_s,
        seed,
        warmup_max_tokens=cfg.warmup_max_tokens,
    )
    many = len(cfg.seeds) > 1
    try:
        got = await run_one(
            session,
            fleet,
            c.name,
            url,
            c.pids(),
            wl,
            plan,
            raw,
            cfg.overrides.get(wl),
            dict(getattr(c, "headers", None) or {}),
            tag_suffix=f"-s{seed}" if many else "",
        )
    except (RunError, aiohttp.ClientError, TimeoutError) as exc:
        _say(f"   {wl} (seed {seed}): failed: {exc}")
        down = _down(c.name, [wl], cfg.fleet, "failed", str(exc)[:300])
        return [{**r, "seed": seed} for r in down]
    top = got[-1]
    _say(
        f"   {wl} (seed {seed}): top {top['offered_qps']:g} req/s TTFT p90 "
        f"{top['ttft_p90_s']} s, {top['output_tok_s']} tok/s, success "
        f"{top['success_rate']}, hit {top['hit_rate']}"
    )
    return [{**r, "seed": seed} for r in got]


async def _run_contender(
    cfg: SuiteConfig,
    session: aiohttp.ClientSession,
    fleet: RunningFleet,
    c: Contender,
    runs: Sequence[tuple[str, int]],
    raw: Path,
) -> list[dict[str, Any]]:
    """Start contender `c`, run each (workload, seed) of `runs` through it, stop it."""
    _say(f"== {c.name}" + (f" ({runs[0][0]}, seed {runs[0][1]})" if cfg.interleave else ""))
    try:
        url = await c.start(fleet.info)
    except ContenderUnavailable as exc:
        _say(f"   unavailable: {exc.reason}")
        workloads = list(dict.fromkeys(wl for wl, _ in runs))
        down = _down(c.name, workloads, cfg.fleet, "unavailable", exc.reason)
        return [{**r, "seed": runs[0][1]} for r in down] if cfg.interleave else down
    rows: list[dict[str, Any]] = []
    try:
        for wl, seed in runs:
            rows += await _run_seed(cfg, session, fleet, c, url, wl, seed, raw)
    finally:
        await c.stop()
    return rows


def _workload_meta(cfg: SuiteConfig, fleet: RunningFleet) -> dict[str, Any]:
    out = {}
    for wl in cfg.workloads:
        w = make_workload(wl, fleet.size, cfg.seeds[0], cfg.overrides.get(wl))
        ws = w.working_set_tokens
        out[wl] = {
            **w.params,
            "working_set_tokens": ws,
            "working_set_vs_fleet_kv": round(ws / fleet.size.fleet_tokens, 3),
            "working_set_vs_replica_kv": round(ws / fleet.size.replica_tokens, 2),
        }
    return out


def suite_meta(cfg: SuiteConfig) -> dict[str, Any]:
    """The configuration as plain data (for logs)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
