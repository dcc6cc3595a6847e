"""Per workload: one fleet sized from it; per round, every contender on cold caches in turn."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.replay import measure
from benchmarks.replay.ceiling import (
    KvSizing,
    PromptTokens,
    context_for,
    hit_ceiling,
    size_cache,
    working_set_blocks,
)
from benchmarks.replay.client import Client, until_routing, warm
from benchmarks.replay.colocation import colocation
from benchmarks.replay.contenders import DIRECT, Placed, PlacementMissing
from benchmarks.replay.loop import Record, closed_loop
from benchmarks.replay.workloads import Item, Spec, build
from benchmarks.routing_bench.contenders import Contender, ContenderUnavailable
from benchmarks.routing_bench.fleet import (
    PREEMPTIONS,
    SUCCESS,
    RunningFleet,
    SimParams,
    reset_caches,
    start_sim,
    start_vllm_cpu,
)
from benchmarks.routing_bench.gateway_contender import GatewayContender
from benchmarks.routing_bench.runner import RunError, wait_idle
from benchmarks.routing_bench.stats import cached_token_rate, error_kinds, ok, percentile

BLOCK_SIZE = {"sim": 16, "vllm-cpu": 32}  # vLLM's CPU backend needs a multiple of 32
# How long a gateway's request log may trail the client's last answer.
_PLACEMENT_WAIT_S = 5.0
# (contender, round) -> request id -> replica index, as a gateway placed them.
Placements = dict[tuple[str, int], dict[str, int]]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """What `llm-gateway bench replay` runs."""

    out: Path
    specs: dict[str, Spec]  # workload name -> sizes, in run order
    contenders: tuple[str, ...]
    fleet: str = "sim"
    replicas: int = 4
    in_flight: int = 4
    rounds: tuple[int, ...] = (0, 1)
    max_tokens: int = 32
    kv_fraction: float = 0.7
    time_scale: float = 1.0  # the simulator's clock speed-up (sim fleets only)
    replay_timeout_s: float = 1800.0
    variants: Path | None = None
    command: str = ""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A workload's requests and token streams per round, and the cache sized from them."""

    name: str
    items: dict[int, list[Item]]
    ids: dict[int, dict[str, list[int]]]  # round -> request id -> prompt token ids
    ceiling: dict[int, float | None]
    sizing: KvSizing
    max_model_len: int
    longest_prompt: int
    meta: dict[str, Any]


def tokenizer_dir(fleet: str) -> str | None:
    """The fleet's tokenizer: the simulator's built-in one, or the vllm-cpu model's."""
    if fleet == "sim":
        return None
    from benchmarks.vllm_cpu import cache_root, model_dir

    return str(model_dir(cache_root()))


def prepare(cfg: ReplayConfig, name: str, codec: PromptTokens) -> Prepared:
    """Token streams of every round; the KV sizing from the largest round's working set."""
    block = BLOCK_SIZE[cfg.fleet]
    items, ids, ceiling, ws = {}, {}, {}, []
    for rnd in cfg.rounds:
        items[rnd] = build(cfg.specs[name], rnd, cfg.max_tokens)
        ids[rnd] = {it.req.rid: codec.ids(it.req) for it in items[rnd]}
        ceiling[rnd] = hit_ceiling(ids[rnd].values(), block).rate
        ws.append(working_set_blocks(ids[rnd].values(), block))
    longest = max(len(x) for r in ids.values() for x in r.values())
    context = context_for(longest, cfg.max_tokens)
    # vLLM refuses a cache smaller than one context; the simulator needs one request's blocks.
    need = context if cfg.fleet == "vllm-cpu" else longest + cfg.max_tokens
    sizing = size_cache(max(ws), cfg.replicas, block, math.ceil(need / block), cfg.kv_fraction)
    meta = {
        "requests_per_round": {str(r): len(v) for r, v in items.items()},
        "working_set_blocks_per_round": dict(zip(map(str, cfg.rounds), ws, strict=True)),
        "ceiling_per_round": {str(r): c for r, c in ceiling.items()},
        "longest_prompt_tokens": longest,
        "max_model_len": context,
        "kv": sizing.as_json(),
    }
    return Prepared(name, items, ids, ceiling, sizing, context, longest, meta)


async def start_fleet(cfg: ReplayConfig, prep: Prepared) -> RunningFleet:
    blocks = prep.sizing.blocks_per_replica
    if cfg.fleet == "sim":
        params = SimParams(cfg.replicas, blocks, BLOCK_SIZE["sim"], cfg.time_scale)
        return await start_sim(params, cfg.out / f"sim-{prep.name}.log")
    return await start_vllm_cpu(cfg.replicas, blocks, BLOCK_SIZE["vllm-cpu"], prep.max_model_len)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def summarize(
    records: Sequence[Record],
    ids: dict[str, list[int]],
    block_size: int,
    before: Sequence[dict[str, float]],
    after: Sequence[dict[str, float]],
) -> dict[str, Any]:
    """A replay's figures: latency, successes, shares and hit rate from the replicas' counters."""
    good = [r for r in records if ok(r)]
    ttft = [float(r["ttft"]) for r in good]
    done = measure.deltas(before, after, SUCCESS)
    share = measure.shares(done)
    as_sent = hit_ceiling((ids[r["rid"]] for r in records), block_size).rate
    return {
        "requests": len(records),
        "succeeded": len(good),
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p90_s": _r(percentile(ttft, 90)),
        "e2e_p50_s": _r(percentile([float(r["e2e"]) for r in good], 50)),
        "replica_requests": [round(x) for x in done],
        "shares": share,
        "max_min_share": measure.max_min_share(share),
        "idle_replicas": sum(1 for x in done if x <= 0),
        "hit_rate": measure.hit_rate(before, after),
        "ceiling_as_sent": _r(as_sent),
        "cached_token_rate": _r(cached_token_rate(good)),
        "preemptions": round(sum(measure.deltas(before, after, PREEMPTIONS))),
        "errors": error_kinds(records),
        **colocation(records),
    }


async def run_contender(
    cfg: ReplayConfig,
    session: aiohttp.ClientSession,
    fleet: RunningFleet,
    prep: Prepared,
    rnd: int,
    c: Contender,
    placements: Placements,
) -> dict[str, Any]:
    """One contender x one round on cold caches: its row (status ok, unavailable or failed).

    A gateway's placement of the round goes into `placements`; a `placed:` contender reads it.
    """
    row: dict[str, Any] = {"contender": c.name, "workload": prep.name, "round": rnd}
    row["ceiling"] = _r(prep.ceiling[rnd])
    urls = fleet.info.urls
    if isinstance(c, Placed):
        try:
            c.use(placements.get((c.source, rnd), {}), prep.items[rnd])
        except PlacementMissing as exc:
            return {**row, "status": "unavailable", "reason": str(exc)}
    await wait_idle(session, urls)
    try:
        base = await c.start(fleet.info)
    except ContenderUnavailable as exc:
        return {**row, "status": "unavailable", "reason": exc.reason}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
            sender = Client(client, fleet.info.model, c, base)
            # Probes first (their prompts and counts are reset away before the replay).
            row["probes"], row["ready_s"] = await until_routing(sender)
            await wait_idle(session, urls)
            await reset_caches(session, urls)
            before = await measure.counters(session, urls)
            mark = measure.CpuMark.take(fleet.pids(), c.pids())
            async with asyncio.timeout(cfg.replay_timeout_s):
                records = await closed_loop(prep.items[rnd], cfg.in_flight, sender.send)
            end = measure.CpuMark.take(fleet.pids(), c.pids())
            if isinstance(c, GatewayContender) and c.mode.request_log:
                placements[(c.name, rnd)] = await _placed(c, records)
        # The replicas' counters settle once nothing runs (the last finish is recorded).
        await wait_idle(session, urls)
        after = await measure.counters(session, urls)
    except (RunError, aiohttp.ClientError, TimeoutError) as exc:
        return {**row, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        await c.stop()
    raw = cfg.out / "raw" / f"{prep.name}-r{rnd}-{c.name.replace(':', '_')}.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    row.update(status="ok", wall_s=round(end.t - mark.t, 2), **measure.cpu_delta(mark, end))
    row.update(summarize(records, prep.ids[rnd], prep.sizing.block_size, before, after))
    return row


async def _placed(c: GatewayContender, records: list[Record]) -> dict[str, int]:
    """Where the gateway sent each request (from its request log), also set on the records.

    A request's record is logged once its stream has ended at the gateway, which can be just
    after the client read the last byte: the log is read again until it has every request.
    """
    prefix = c.name.replace(":", "_") + "-"  # the x-request-id Client sends
    want = {rec["rid"] for rec in records}
    deadline = time.monotonic() + _PLACEMENT_WAIT_S
    while True:
        index = {}
        for request_id, name in c.placements().items():
            # The generated config names replica i "replica-i".
            if request_id.startswith(prefix) and name.startswith("replica-"):
                index[request_id.removeprefix(prefix)] = int(name.removeprefix("replica-"))
        if want <= index.keys() or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)  # polling the log file under a deadline
    for rec in records:
        rec["replica"] = index.get(rec["rid"])
    return index


def add_cpu_ratio(rows: list[dict[str, Any]]) -> None:
    """Each row's replica CPU over `direct`'s in the same workload and round."""
    ref = {
        (r["workload"], r["round"]): r.get("replica_cpu_s")
        for r in rows
        if r["contender"] == DIRECT and r.get("status") == "ok"
    }
    for r in rows:
        d = ref.get((r["workload"], r["round"]))
        mine = r.get("replica_cpu_s")
        r["cpu_vs_direct"] = round(mine / d, 3) if mine is not None and d else None


async def run_workload(
    cfg: ReplayConfig, prep: Prepared, contenders: Sequence[Contender]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Start the workload's fleet, warm it, replay every round through every contender.

    Returns the rows and the fleet's parameters as it ran.
    """
    rows: list[dict[str, Any]] = []
    placements: Placements = {}
    fleet = await start_fleet(cfg, prep)
    try:
        async with aiohttp.ClientSession() as session:
            await warm(session, fleet)
            for rnd in cfg.rounds:
                for c in contenders:
                    _say(f"== {prep.name} round {rnd}: {c.name}")
                    row = await run_contender(cfg, session, fleet, prep, rnd, c, placements)
                    _say(f"   {_brief(row)}")
                    rows.append(row)
    finally:
        await fleet.stop()
    return rows, {**fleet.params, "model": fleet.info.model}


def _brief(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason')}"
    return (
        f"wall {row['wall_s']} s, TTFT p50 {row['ttft_p50_s']} s, ok {row['succeeded']}/"
        f"{row['requests']}, hit {row['hit_rate']} (ceiling {row['ceiling']}), shares "
        f"{row['shares']}, replicas' CPU {row['replica_cpu_s']} s"
    )
