"""Prefix caching as a client sees it: cached_tokens agrees with the hit/query counters."""

from __future__ import annotations

import httpx

from tests.conformance.helpers import (
    Prompts,
    Target,
    cached_tokens,
    complete,
    prompt_of,
    scrape,
    wait_for,
)

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


async def _counters(client: httpx.AsyncClient, target: Target) -> tuple[float, float]:
    metrics = await scrape(client)
    return metrics.value(HITS, model_name=target.model), metrics.value(
        QUERIES, model_name=target.model
    )


async def _settles_at(
    client: httpx.AsyncClient, target: Target, hits: float, queries: float
) -> None:
    async def probe() -> bool:
        return await _counters(client, target) == (hits, queries)

    await wait_for(probe, f"hits={hits} queries={queries}")


async def test_repeated_prompt_hits_the_cache(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 6 * target.block_size)
    hits0, queries0 = await _counters(client, target)

    cold = await complete(client, target, text, max_tokens=2)
    assert cold["usage"]["prompt_tokens"] == len(ids)
    assert cached_tokens(cold["usage"]) == 0
    await _settles_at(client, target, hits0, queries0 + len(ids))

    warm = await complete(client, target, text, max_tokens=2)
    cached = cached_tokens(warm["usage"])
    assert cached > 0 and cached % target.block_size == 0
    # Every full block is reusable except that the last prompt token is always recomputed.
    assert cached == (len(ids) - 1) // target.block_size * target.block_size
    await _settles_at(client, target, hits0 + cached, queries0 + 2 * len(ids))


async def test_shared_prefix_hits_only_whole_common_blocks(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 4 * target.block_size)
    await complete(client, target, text, max_tokens=1)
    longer = text + " " + prompts.text(40)
    longer_ids = await client.post("/tokenize", json={"model": target.model, "prompt": longer})
    common = 0
    for a, b in zip(ids, longer_ids.json()["tokens"], strict=False):
        if a != b:
            break
        common += 1
    out = await complete(client, target, longer, max_tokens=1)
    assert cached_tokens(out["usage"]) == common // target.block_size * target.block_size
