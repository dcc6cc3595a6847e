"""The simulator answers as vLLM 0.32.0 does: the same requests to a real replica and to a
simulator with the same model name, tokenizer, block size and context length, compared.

Error bodies must be identical; usage objects too (same tokenizer, so the same token counts,
cache hits and cache writes). Complements the black-box conformance suite, which checks each
target against expectations: here a drift of either side shows up as a concrete diff.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from benchmarks.vllm_cpu import VllmFleet
from simulator import SimConfig, SimFleet
from tests.conformance.helpers import parse_sse
from tests.vllm.conftest import TIMEOUT_S

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

Pair = tuple[httpx.AsyncClient, httpx.AsyncClient]


@pytest_asyncio.fixture(loop_scope="package")
async def pair(fleet: VllmFleet) -> AsyncIterator[Pair]:
    """Clients to replica 0 of the real fleet and to a simulator configured like it."""
    cfg = SimConfig(
        model=fleet.model,
        lora_adapters=(fleet.lora_name,) if fleet.lora_name else (),
        max_model_len=fleet.max_model_len,
        block_size=fleet.block_size,
        num_gpu_blocks=fleet.num_gpu_blocks,
        tokenizer=str(fleet.model_dir),
        time_scale=100.0,
        kv_events=False,
    )
    async with (
        SimFleet(cfg, replicas=1, host="127.0.0.1", base_port=0) as sims,
        httpx.AsyncClient(base_url=fleet.replicas[0].url, timeout=60.0) as real,
        httpx.AsyncClient(base_url=sims.replicas[0].url, timeout=60.0) as sim,
    ):
        yield real, sim


async def _both(pair: Pair, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
    out = []
    for client in pair:
        resp = await client.post(path, json=body)
        out.append((resp.status_code, resp.json()))
    return out[0], out[1]


async def test_error_bodies_are_identical(pair: Pair, fleet: VllmFleet) -> None:
    m, n = fleet.model, fleet.max_model_len
    long_text = "alpha " * 2 * n
    chat = [{"role": "user", "content": "hi"}]
    long_chat = [{"role": "user", "content": long_text}]
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"model": m, "max_tokens": 2}),
        ("/v1/completions", {"model": m, "prompt": "", "max_tokens": 2}),
        ("/v1/completions", {"model": m, "prompt": [], "max_tokens": 2}),
        ("/v1/chat/completions", {"model": m, "max_tokens": 2}),
        ("/v1/chat/completions", {"model": m, "messages": [], "max_tokens": 2}),
        ("/v1/completions", {"model": "nope", "prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "nope", "messages": chat}),
        ("/v1/completions", {"model": m, "prompt": long_text, "max_tokens": 2}),
        # Past max_model_len x the longest vocabulary entry: refused on characters, untokenized.
        ("/v1/completions", {"model": m, "prompt": long_text * 2, "max_tokens": 2}),
        ("/v1/chat/completions", {"model": m, "messages": long_chat}),
        ("/v1/completions", {"model": m, "prompt": [5] * (n + 5), "max_tokens": 2}),
        ("/v1/completions", {"model": m, "prompt": [5] * (n + 1)}),
        ("/v1/completions", {"model": m, "prompt": [5] * n, "max_tokens": 2}),
        ("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": n + 1}),
        ("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 0}),
        ("/v1/chat/completions", {"model": m, "messages": chat, "max_tokens": n + 1}),
        ("/v1/chat/completions", {"model": m, "messages": chat, "max_completion_tokens": n + 1}),
    ]  # fmt: skip
    for path, body in cases:
        real, sim = await _both(pair, path, body)
        assert real[0] >= 400, (path, body, real)
        assert sim == real, (path, orjson.dumps(body)[:200])


async def _stream_usage(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", path, json=body) as resp:
        raw = b"".join([chunk async for chunk in resp.aiter_raw()])
    assert resp.status_code == 200, raw[:500]
    return parse_sse(raw).chunks[-1]["usage"]


async def test_usage_is_identical(pair: Pair, fleet: VllmFleet) -> None:
    nonce = f"usage{time.time_ns()}"
    words = " ".join(["alpha bravo charlie delta echo foxtrot"] * 20)
    for i, (path, key) in enumerate(
        [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")] * 2
    ):
        text = f"{nonce} {i} {words}"
        prompt: Any = text if key == "prompt" else [{"role": "user", "content": text}]
        body = {"model": fleet.model, key: prompt, "max_tokens": 3, "ignore_eos": True}
        stream = i >= 2
        usages = []
        for client in pair:
            # Cold, then warm: cached_tokens and (chat) created_cache_tokens change.
            for _ in range(2):
                if stream:
                    usages.append(await _stream_usage(client, path, body))
                else:
                    resp = await client.post(path, json=body)
                    assert resp.status_code == 200, resp.text
                    usages.append(resp.json()["usage"])
        real, sim = usages[:2], usages[2:]
        assert list(map(list, sim)) == list(map(list, real)), (path, stream)  # key order too
        assert sim == real, (path, stream)
