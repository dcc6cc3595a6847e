"""A shared-prefix workload on a bounded cache: prefix-aware routing beats round-robin on
vLLM's own prefix-cache counters."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import httpx
import pytest

from benchmarks.vllm_cpu import VllmFleet
from routing.profile import BUILTIN_PROFILES, ProfileSpec
from tests.vllm.conftest import TIMEOUT_S, gateway_for, metric, reset_caches

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

# 8 prefixes of 17 blocks: 136 blocks, about 70% of the fleet's 192 and more than one
# replica's 96. Round-robin makes every replica hold every prefix and LRU thrashes on
# the cycle; prefix affinity keeps each prefix on one replica, where it fits.
PREFIXES = 8
PREFIX_BLOCKS = 17
ROUNDS = 4
CONCURRENCY = 2
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def _seeded_default() -> ProfileSpec:
    """The built-in default profile with a fixed tie-break seed (a reproducible placement)."""
    spec = BUILTIN_PROFILES["default"]
    return replace(spec, picker=replace(spec.picker, params={**spec.picker.params, "seed": 0}))


async def _prefix_text(direct: httpx.AsyncClient, fleet: VllmFleet, i: int) -> str:
    """Prefix i: exactly PREFIX_BLOCKS full blocks of tokens (a suffix then follows)."""
    rng = random.Random(i)
    words = " ".join(rng.choice(["amber", "basil", "cedar", "dune", "ember", "fern"])
                     for _ in range(PREFIX_BLOCKS * fleet.block_size))  # fmt: skip
    text = f"document {i}: {words}"
    url = fleet.replicas[0].url + "/tokenize"
    ids = (await direct.post(url, json={"model": fleet.model, "prompt": text})).json()["tokens"]
    assert len(ids) >= PREFIX_BLOCKS * fleet.block_size
    return str(await _detok(direct, fleet, ids[: PREFIX_BLOCKS * fleet.block_size]))


async def _detok(direct: httpx.AsyncClient, fleet: VllmFleet, ids: list[int]) -> str:
    url = fleet.replicas[0].url + "/detokenize"
    resp = await direct.post(url, json={"model": fleet.model, "tokens": ids[1:]})  # no BOS
    assert resp.status_code == 200, resp.text
    return str(resp.json()["prompt"])


async def _run(fleet: VllmFleet, profile: str, prefixes: list[str]) -> float:
    """Hit ratio (hits / queries, in tokens, summed over the fleet) of one workload run."""
    async with httpx.AsyncClient(timeout=60.0) as direct:
        await reset_caches(fleet, direct)
        before = [(await metric(direct, r.url, HITS), await metric(direct, r.url, QUERIES))
                  for r in fleet.replicas]  # fmt: skip
        routing = {"default": _seeded_default()} if profile == "default" else {}
        async with gateway_for(fleet, profile, profiles=routing) as (_, client):
            rng = random.Random(7)
            rounds = [
                [(i, n) for i in rng.sample(range(PREFIXES), PREFIXES)] for n in range(ROUNDS)
            ]

            async def worker(queue: asyncio.Queue[tuple[int, int]]) -> None:
                while not queue.empty():
                    i, n = queue.get_nowait()
                    body = {"model": fleet.model, "max_tokens": 1,
                            "prompt": f"{prefixes[i]} question {n} about item {i}?"}  # fmt: skip
                    resp = await client.post("/v1/completions", json=body)
                    assert resp.status_code == 200, resp.text

            # Every round 2 in flight, first sights too: placed by momentary load, new
            # prefixes followed whichever replica was free and piled 5-6 of the 8 on one,
            # past its cache (hit 0.19-0.30 against 0.61-0.74 in 2 runs of 4), until the
            # share window placed them by fewest recent picks (affinity_guard share_band).
            for jobs in rounds:
                queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
                for job in jobs:
                    queue.put_nowait(job)
                await asyncio.gather(*(worker(queue) for _ in range(CONCURRENCY)))
        after = [(await metric(direct, r.url, HITS), await metric(direct, r.url, QUERIES))
                 for r in fleet.replicas]  # fmt: skip
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    assert queries > 0
    return hits / queries


async def test_prefix_routing_beats_round_robin_on_real_hit_rate(fleet: VllmFleet) -> None:
    async with httpx.AsyncClient(timeout=30.0) as direct:
        prefixes = [await _prefix_text(direct, fleet, i) for i in range(PREFIXES)]
    round_robin = await _run(fleet, "round_robin", prefixes)
    prefix_aware = await _run(fleet, "default", prefixes)
    print(f"\nreal vLLM prefix-cache hit ratio: round_robin {round_robin:.3f}, "
          f"default (prefix-aware) {prefix_aware:.3f}")  # fmt: skip
    assert prefix_aware > round_robin + 0.2, (round_robin, prefix_aware)
