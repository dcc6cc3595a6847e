"""A real pooling replica (the tiny model run with --runner pooling --convert embed): the
conformance suite's pooling tests against it, and the openai SDK's embeddings through a
gateway whose replicas are the generative fleet and it.

What vLLM 0.32 serves for the converted model: /v1/embeddings, /pooling (task embed; it
refuses classify and token_embed), /score, /v1/score, /rerank, /v1/rerank, /v2/rerank; no
/classify (404), no generation route.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from benchmarks.vllm_cpu import MODEL_NAME, VllmCpuError, VllmFleet
from gateway.config import ReplicaConfig
from gateway.process import running_gateway
from tests.vllm.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    NUM_GPU_BLOCKS,
    TIMEOUT_S,
    gateway_config,
    run_conformance,
    wait_until,
)

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

# vLLM behaviours the simulator's pooling runner deliberately does not copy (no test asserts
# them): the order of the supported tasks in /pooling's refusal of another task (vLLM lists
# them from a set, so it changes with each process's hash seed; the simulator fixes one).
KNOWN_DIFFERENCES: dict[str, str] = {}


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def pooling(fleet: VllmFleet) -> AsyncIterator[VllmFleet]:
    """One pooling replica, started once the generative fleet is up (never beside its start)."""
    f = VllmFleet(
        1,
        runner="pooling",
        kv_events=False,
        lora=False,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        startup_timeout_s=300.0,
    )
    started = time.monotonic()
    async with f:
        print(f"pooling replica healthy in {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield f


async def test_the_pooling_command_line() -> None:
    f = VllmFleet(1, runner="pooling", kv_events=False, lora=False)
    cmd = f.command(8000, None, None)
    assert cmd[cmd.index("--runner") + 1] == "pooling"
    assert cmd[cmd.index("--convert") + 1] == "embed"
    assert cmd[cmd.index("--served-model-name") + 1] == f.model == MODEL_NAME + "-embed"
    assert "--enable-prefix-caching" not in cmd and "--enable-lora" not in cmd
    assert "--enable-prefix-caching" in VllmFleet(1).command(8000, None, None)
    with pytest.raises(VllmCpuError, match="neither kv_events nor lora"):
        VllmFleet(1, runner="pooling")


async def test_conformance_pooling_tests_pass_against_real_vllm(
    fleet: VllmFleet, pooling: VllmFleet
) -> None:
    env = {
        "LLMGW_VLLM_URL": fleet.replicas[0].url,
        "LLMGW_VLLM_MODEL": fleet.model,
        "LLMGW_VLLM_BLOCK_SIZE": str(fleet.block_size),
        "LLMGW_VLLM_POOLING_URL": pooling.replicas[0].url,
        "LLMGW_VLLM_POOLING_MODEL": pooling.model,
    }
    target = "tests/conformance/test_pooling_routes.py"
    await run_conformance(env, KNOWN_DIFFERENCES, target, what="pooling conformance vs real vLLM")


async def test_openai_sdk_embeddings_through_the_gateway(
    fleet: VllmFleet, pooling: VllmFleet
) -> None:
    base = gateway_config(fleet)
    embed = ReplicaConfig(url=pooling.replicas[0].url, name="vllm-embed-0", kv_events="")
    cfg = dataclasses.replace(base, replicas=(*base.replicas, embed))
    async with (
        running_gateway(cfg) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60.0) as http,
        httpx.AsyncClient(base_url=pooling.replicas[0].url, timeout=60.0) as direct,
        openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as client,
    ):

        async def ready() -> bool:
            return all(r.healthy and r.models for r in gw.runtime.pool)

        await wait_until(ready, "the fleet and the pooling replica healthy at the gateway")
        model = pooling.model
        listed = {m.id for m in (await client.models.list()).data}
        assert {fleet.model, model} <= listed
        texts = ["alpha bravo", "charlie delta echo", "foxtrot"]
        want = (await direct.post("/v1/embeddings", json={"model": model, "input": texts})).json()
        # The SDK asks for base64 and decodes it itself.
        batch = await client.embeddings.create(model=model, input=texts)
        assert batch.model == model and [d.index for d in batch.data] == [0, 1, 2]
        for got, ref in zip(batch.data, want["data"], strict=True):
            assert len(got.embedding) == len(ref["embedding"]) > 0
            assert all(abs(a - b) < 1e-4 for a, b in zip(got.embedding, ref["embedding"],
                                                         strict=True))  # fmt: skip
        assert batch.usage.prompt_tokens == batch.usage.total_tokens
        assert batch.usage.prompt_tokens == want["usage"]["prompt_tokens"]
        one = await client.embeddings.create(model=model, input="alpha bravo",
                                             encoding_format="float")  # fmt: skip
        assert len(one.data) == 1
        assert all(
            abs(a - b) < 1e-4
            for a, b in zip(one.data[0].embedding, want["data"][0]["embedding"], strict=True)
        )
        # The generative model has no embedding route: the gateway's error names it.
        with pytest.raises(openai.NotFoundError, match="does not support the Embeddings API"):
            await client.embeddings.create(model=fleet.model, input="x")
        # The rest of the pooling family through the same gateway, and what the model refuses.
        ranked = await http.post(
            "/v2/rerank", json={"model": model, "query": "alpha", "documents": ["bravo", "alpha"]}
        )
        assert ranked.status_code == 200 and ranked.json()["results"][0]["index"] == 1
        scored = await http.post("/score", json={"model": model, "text_1": "a", "text_2": "a"})
        assert scored.status_code == 200 and abs(scored.json()["data"][0]["score"] - 1) < 1e-4
        pooled = await http.post("/pooling", json={"model": model, "input": "alpha bravo"})
        assert pooled.status_code == 200, pooled.text
        refused = await http.post("/classify", json={"model": model, "input": "x"})
        assert refused.status_code == 404
        assert "does not support the Classification API" in refused.json()["error"]["message"]
