"""Routing cost per request: hashing, tier lookups and the router, with tokenization apart.

`llm-gateway bench routing-cost [--out DIR] [--quick]` measures, in one process, for 4, 8 and
16 replicas and prompts of 1k and 8k tokens, in approximate mode (64-character blocks, index fed
by routing history) and precise mode (16-token blocks, index fed by BlockStored events):

- `tokenize_us`: the built-in tokenizer on the prompt (precise mode only; approximate mode
  needs no tokenizer) — reported apart, as the issue asks;
- `hash_us`: templating plus block and prompt hashing. Like tokenization it is linear in the
  prompt and done once per request (`Affinity.digest`, in a worker thread above 4k tokens);
- `decision_us`: the routing decision proper, on the event loop: tier 1/2 lookups (the
  longest-prefix walk over every block), replica snapshots, `route()`, and the chosen
  replica's lease taken and released (its in-flight count changes, as each request's does,
  so its snapshot is rebuilt at the next decision rather than served from the cache);
- `route_us`: `route()` alone;
- `bytes_per_block`: index memory per cached block (tracemalloc), with the configured bound.

results.json: {"rows": [{"mode", "prompt_tokens", "replicas", "tokenize_us", "hash_us",
"decision_us", "route_us", "matched_blocks", "prompt_blocks", "index_blocks",
"bytes_per_block"}], "target": {"replicas", "decision_us", "worst_decision_us", "pass"},
"machine": {...}}.
Medians of repeated timings; CPU-bound and single-threaded, so the figures are per core.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from cache_index.hashing import block_hashes, prompt_hash
from gateway.config import CacheIndexConfig, ReplicaConfig
from gateway.proxy.affinity import Affinity, Digest
from gateway.proxy.requests import parse_request
from gateway.replicas.pool import ReplicaPool
from routing.profile import BUILTIN_PROFILES
from routing.router import Router
from vllm_api.kv_events import BlockStored, EventBatch
from vllm_api.tokenizer import BuiltinTokenizer

REPLICA_COUNTS = (4, 8, 16)
# The bound is stated for this many replicas (and 8k-token prompts).
TARGET_REPLICAS = 16
# Distinct cached prompts per replica in the index (the working set the lookups run against).
PROMPTS_PER_REPLICA = 64
TARGET_DECISION_US = 150.0
_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda")


def _prompt(tokens: int, salt: int) -> str:
    # ~1 built-in token per word+space; a salt word up front makes prompts differ from block 0.
    words = [f"s{salt}"] + [_WORDS[(i * 7 + salt) % len(_WORDS)] for i in range(tokens - 1)]
    return " ".join(words)


def _median_us(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    return statistics.median(samples)


def _pool(replicas: int) -> ReplicaPool:
    configs = tuple(
        ReplicaConfig(url=f"http://10.0.0.{i}:8000", name=f"r{i}", models=("m",))
        for i in range(replicas)
    )
    pool = ReplicaPool.from_configs(configs)
    for i, r in enumerate(pool):
        r.healthy = True
        r.in_flight = i % 4
    return pool


def _fill(aff: Affinity, mode: str, tokens: int, per_replica: int, replicas: int) -> None:
    tok = BuiltinTokenizer()
    for rep in range(replicas):
        for p in range(per_replica):
            text = _prompt(tokens, 1000 + rep * per_replica + p)
            if mode == "approximate":
                req = parse_request(
                    "completions", orjson.dumps({"model": "m", "prompt": text}), "x"
                )
                aff.record(aff.features(req, []), f"r{rep}")
            else:
                ids = tok.encode(text)
                n = len(ids) // 16 * 16
                hashes = [(rep << 40) + p * 4096 + i for i in range(n // 16)]
                batch = EventBatch(
                    time.time(),
                    (BlockStored(tuple(hashes), None, tuple(ids[:n]), 16, None, "GPU"),),
                    0,
                )
                aff.prefixes.apply_events(f"r{rep}", batch, p)


def measure(
    mode: str,
    tokens: int,
    repeat: int,
    per_replica: int = PROMPTS_PER_REPLICA,
    replicas: int = TARGET_REPLICAS,
) -> dict[str, Any]:
    """One row: a filled index, then a request that shares its prefix with one replica's."""
    cfg = CacheIndexConfig(tokenizer="builtin" if mode == "precise" else "")
    aff = Affinity(cfg, is_lora=lambda _m: False)
    pool = _pool(replicas)
    for r in pool:
        aff.prefixes.set_capacity(r.name, 4 * per_replica * tokens // 16)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _fill(aff, mode, tokens, per_replica, replicas)
    index_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    index_blocks = len(aff.prefixes)
    router = Router(BUILTIN_PROFILES["default"])
    # Same prompt as one cached on r3, with a fresh tail: a prefix hit on r3.
    text = _prompt(tokens, 1000 + 3 * per_replica) + " and a new question?"
    body = orjson.dumps({"model": "m", "prompt": text, "max_tokens": 16})
    req = parse_request("completions", body, "rid")
    tok = BuiltinTokenizer()
    tok.encode(text)  # warm the piece cache, as a long-running gateway's is
    tokenize_us = _median_us(lambda: tok.encode(text), repeat) if mode == "precise" else 0.0
    ids = tok.encode(text)

    def digest() -> Digest:
        if mode == "precise":
            return Digest(len(ids), prompt_hash("m", text), tuple(block_hashes(ids, 16)), 16)
        got = aff.digest(req)
        assert got is not None
        return got

    digested = digest()

    def decision() -> object:
        chosen = router.route(aff.lookup(req, [], digested), pool.snapshots())
        pool.acquire(chosen.replica.name).release(None)
        return chosen

    features = aff.lookup(req, [], digested)
    snaps = pool.snapshots()
    return {
        "mode": mode,
        "prompt_tokens": len(ids),
        "replicas": replicas,
        "tokenize_us": round(tokenize_us, 1),
        "hash_us": round(_median_us(digest, repeat), 1),
        "decision_us": round(_median_us(decision, repeat), 1),
        "route_us": round(_median_us(lambda: router.route(features, snaps), repeat), 1),
        "matched_blocks": max(features.prefix_match.values(), default=0),
        "prompt_blocks": len(features.block_hashes),
        "index_blocks": index_blocks,
        "bytes_per_block": round(index_bytes / max(index_blocks, 1)),
    }


def _report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Routing cost per request",
        "",
        f"{', '.join(str(n) for n in REPLICA_COUNTS)} replicas, {PROMPTS_PER_REPLICA} cached"
        " prompts per replica in the index (fewer with --quick), default profile,"
        f" Python {platform.python_version()} on {platform.machine()} (one core).",
        f"Target: decision <= {TARGET_DECISION_US:.0f} us excluding tokenization, with"
        f" {TARGET_REPLICAS} replicas (the other counts are shown beside it against the same"
        " figure). Tokenizing and hashing are per-prompt feature extraction (linear in its"
        " length, once per request, in a worker thread above 4k tokens); the decision is the"
        " on-loop part.",
        "",
        "| mode | prompt tokens | replicas | tokenize us | template+hash us | decision us |"
        " route() us | matched/prompt blocks | index blocks | bytes/block | decision target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "pass" if r["decision_us"] <= TARGET_DECISION_US else "MISS"
        lines.append(
            f"| {r['mode']} | {r['prompt_tokens']} | {r['replicas']} | {r['tokenize_us']} |"
            f" {r['hash_us']} |"
            f" {r['decision_us']} |"
            f" {r['route_us']} | {r['matched_blocks']}/{r['prompt_blocks']} |"
            f" {r['index_blocks']} | {r['bytes_per_block']} | {ok} |"
        )
    lines += [
        "",
        "Memory is bounded by `cache_index.max_total_blocks` (default 2,000,000 blocks):"
        " at the bytes/block above that is the index's ceiling.",
    ]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-out/routing-cost", help="output directory")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")


def run(args: argparse.Namespace) -> int:
    repeat, per_replica = (20, 4) if args.quick else (300, PROMPTS_PER_REPLICA)
    rows = [
        measure(m, t, repeat, per_replica, n)
        for m in ("approximate", "precise")
        for t in (1024, 8192)
        for n in REPLICA_COUNTS
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"python": platform.python_version(), "machine": platform.machine()}
    at_target = [r["decision_us"] for r in rows if r["replicas"] == TARGET_REPLICAS]
    target = {
        "replicas": TARGET_REPLICAS,
        "decision_us": TARGET_DECISION_US,
        "worst_decision_us": max(at_target),
        "pass": max(at_target) <= TARGET_DECISION_US,
    }
    results = {"rows": rows, "target": target, "machine": machine}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report = _report(rows)
    (out / "report.md").write_text(report)
    print(report)
    return 0
