"""Embeddings and the pooling family through the gateway, over sockets: the openai SDK
unchanged, batch inputs, placement by load, vLLM's errors relayed, the aliases' paths."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web

from gateway.config import (
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    RoutingConfig,
    ServerConfig,
)
from gateway.process import RunningGateway, running_gateway
from gateway.proxy.requests import Kind, parse_request
from simulator import SimConfig, SimFleet
from tests.gateway.aiohttp_upstream import serve
from tests.gateway.conftest import MODEL, SIM, eventually, gateway_config, in_flight, set_faults

EMBED = "sim-embed"
EMBED_SIM = SimConfig(model=EMBED, runner="pooling", kv_events=False, time_scale=50.0, seed=5)
_DECISION = re.compile(
    r'^llm_gateway_routing_decisions_total\{branch="([^"]+)",replica="([^"]+)"\} (\S+)$', re.M
)


@dataclass
class Mixed:
    gw: RunningGateway
    embed_urls: dict[str, str]


@contextlib.asynccontextmanager
async def _mixed(routing: RoutingConfig | None = None) -> AsyncIterator[Mixed]:
    """Two generative replicas of MODEL and two pooling replicas of EMBED."""
    async with (
        SimFleet(SIM, replicas=2, host="127.0.0.1", base_port=0) as gen,
        SimFleet(EMBED_SIM, replicas=2, host="127.0.0.1", base_port=0) as emb,
    ):
        replicas = (
            *(ReplicaConfig(url=r.url, name=f"gen-{r.index}") for r in gen.replicas),
            *(ReplicaConfig(url=r.url, name=f"emb-{r.index}") for r in emb.replicas),
        )
        cfg = gateway_config(gen, replicas=replicas, routing=routing or RoutingConfig())
        async with running_gateway(cfg) as gw:
            await eventually(lambda: EMBED in gw.runtime.pool.known_models(), what="models")
            yield Mixed(gw, {f"emb-{r.index}": r.url for r in emb.replicas})


@pytest.fixture
async def mixed() -> AsyncIterator[Mixed]:
    """The default profile: pooling requests carry no cache features, so it goes by load."""
    async with _mixed() as m:
        yield m


def _decisions(gw: RunningGateway) -> dict[tuple[str, str], float]:
    text = gw.runtime.metrics.render().decode()
    return {(r, b): float(n) for b, r, n in _DECISION.findall(text)}


def _client(gw: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)


async def test_openai_sdk_embeddings_through_the_gateway(mixed: Mixed) -> None:
    gw = mixed.gw
    async with _client(gw) as client, httpx.AsyncClient(base_url=gw.url, timeout=10) as raw:
        one = await client.embeddings.create(model=EMBED, input="hello world")
        assert len(one.data) == 1 and len(one.data[0].embedding) == EMBED_SIM.embedding_size
        batch = await client.embeddings.create(model=EMBED, input=["hello world", "bye"])
        assert [d.index for d in batch.data] == [0, 1]
        assert batch.data[0].embedding == pytest.approx(one.data[0].embedding, abs=1e-6)
        floats = await client.embeddings.create(
            model=EMBED, input="hello world", encoding_format="float"
        )
        assert floats.data[0].embedding == pytest.approx(one.data[0].embedding, abs=1e-6)
        tok = await raw.post("/tokenize", json={"model": EMBED, "prompt": "hello world"})
        ids = tok.json()["tokens"]
        by_ids = await client.embeddings.create(model=EMBED, input=ids)
        assert by_ids.data[0].embedding == pytest.approx(one.data[0].embedding, abs=1e-6)
        lists = await client.embeddings.create(model=EMBED, input=[ids, ids[:2]])
        assert len(lists.data) == 2 and lists.usage.prompt_tokens == len(ids) + 2
        # vLLM's own 400 for `dimensions` on a model that is not Matryoshka, relayed.
        with pytest.raises(openai.BadRequestError, match="Matryoshka"):
            await client.embeddings.create(model=EMBED, input="x", dimensions=8)
        with pytest.raises(openai.NotFoundError, match="nope"):
            await client.embeddings.create(model="nope", input="x")
        # vLLM ignores `stream` here (an unknown field): one JSON body, through the gateway too.
        r = await raw.post("/v1/embeddings", json={"model": EMBED, "input": "x", "stream": True})
        assert r.status_code == 200 and r.json()["object"] == "list"
        r = await raw.post("/pooling", json={"model": EMBED, "input": "hello world"})
        assert r.status_code == 200 and r.json()["data"][0]["object"] == "pooling"
        assert r.json()["data"][0]["data"] == pytest.approx(one.data[0].embedding, abs=1e-6)
    # Only the pooling replicas served them, placed by load: no prefix, prompt or session tier.
    moved = {k: n for k, n in _decisions(gw).items() if n}
    assert {r for r, _ in moved} == {"emb-0", "emb-1"}
    assert {b for _, b in moved} == {"miss_by_load"}
    assert len(gw.runtime.pipeline._affinity.prompts) == 0


async def test_embeddings_go_to_the_least_loaded_replica() -> None:
    async with _mixed(RoutingConfig(profile="least_load")) as mixed:
        gw = mixed.gw
        # Both replicas hold what they get, so the first request stays on whichever took it.
        for url in mixed.embed_urls.values():
            await set_faults(url, stall_seconds=30.0)
        body = {"model": EMBED, "input": "the same text each time"}
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            stuck = asyncio.create_task(c.post("/v1/embeddings", json=body))
            try:
                await eventually(
                    lambda: in_flight(gw)["emb-0"] + in_flight(gw)["emb-1"] == 1, what="one held"
                )
                busy = "emb-0" if in_flight(gw)["emb-0"] else "emb-1"
                free = "emb-1" if busy == "emb-0" else "emb-0"
                await set_faults(mixed.embed_urls[free], stall_seconds=0.0)
                before = _decisions(gw)
                for _ in range(10):
                    r = await c.post("/v1/embeddings", json=body)
                    assert r.status_code == 200
                after = _decisions(gw)
                moved = {
                    k: n - before.get(k, 0.0) for k, n in after.items() if n > before.get(k, 0)
                }
                # The same input every time, yet no affinity: each goes to the idle replica.
                assert {r for r, _ in moved} == {free} and sum(moved.values()) == 10
            finally:
                stuck.cancel()
                await asyncio.gather(stuck, return_exceptions=True)
                for url in mixed.embed_urls.values():
                    await set_faults(url, stall_seconds=0.0)


async def test_a_generative_only_model_answers_the_route_clearly(mixed: Mixed) -> None:
    async with _client(mixed.gw) as client:
        want = rf"`{MODEL}` does not support the Embeddings API: replica `gen-\d` has no"
        with pytest.raises(openai.NotFoundError, match=want):
            await client.embeddings.create(model=MODEL, input="x")


async def test_score_rerank_and_classify_reach_vllms_paths() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, await request.json()))
        usage = {"prompt_tokens": 9, "total_tokens": 9}
        return web.json_response({"id": "x", "model": EMBED, "usage": usage, "results": []})

    async def models(_: web.Request) -> web.Response:
        card = {"id": EMBED, "object": "model", "max_model_len": 512, "parent": None}
        return web.json_response({"object": "list", "data": [card]})

    app = web.Application()
    for path in ("/score", "/rerank", "/classify"):
        app.router.add_post(path, answer)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", _health)
    async with serve(app) as url:
        cfg = GatewayConfig(
            server=ServerConfig(port=0),
            health_check=HealthCheckConfig(interval_s=0.1, timeout_s=0.5),
            replicas=(ReplicaConfig(url=url, name="r0"),),
        )
        async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url) as c:
            await eventually(lambda: EMBED in gw.runtime.pool.known_models(), what="models")
            calls = {
                "/score": {"text_1": "a", "text_2": ["b"]},
                "/v1/score": {"queries": "a", "documents": ["b"]},
                "/rerank": {"query": "a", "documents": ["b", "c"], "top_n": 1},
                "/v1/rerank": {"query": "a", "documents": ["b"]},
                "/v2/rerank": {"query": "a", "documents": ["b"]},
                "/classify": {"input": ["a", "b"]},
            }
            for path, body in calls.items():
                r = await c.post(path, json={"model": EMBED, **body})
                assert r.status_code == 200 and r.json()["id"] == "x", (path, r.text)
    assert [p for p, _ in seen] == [
        "/score",
        "/score",
        "/rerank",
        "/rerank",
        "/rerank",
        "/classify",
    ]
    assert [b for _, b in seen] == [{"model": EMBED, **b} for b in calls.values()]


async def _health(_: web.Request) -> web.Response:
    return web.Response()


def test_openai_sdk_embeddings_against_llm_gateway_demo() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", "0", "--grpc-port", "0",
         "--replicas", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "demo exited before printing its URL"
            if line.startswith("llm-gateway demo: "):
                url = line.split()[2]
        assert url is not None
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
            # The pooling replica's model is discovered by the gateway's first health checks.
            while time.monotonic() < deadline:
                if EMBED in {m.id for m in client.models.list()}:
                    break
                time.sleep(0.05)
            out = client.embeddings.create(model=EMBED, input=["hello", "world"])
            assert len(out.data) == 2 and len(out.data[0].embedding) == 64
            assert out.model == EMBED and out.usage.prompt_tokens > 0
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert chat.choices[0].message.content
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.mark.parametrize(
    ("kind", "body", "tokens"),
    [
        ("embeddings", {"input": "x" * 40}, 10),
        ("embeddings", {"input": ["x" * 40, "y" * 40]}, 20),
        ("embeddings", {"input": list(range(10))}, 10),
        ("embeddings", {"input": [list(range(10)), [1, 2]]}, 12),
        ("embeddings", {"messages": [{"role": "user", "content": "x" * 40}]}, 10),
        ("pooling", {"input": "x" * 40, "task": "token_embed"}, 10),
        ("rerank", {"query": "x" * 20, "documents": ["y" * 20, {"text": "z" * 40}]}, 20),
        ("score", {"text_1": "x" * 20, "text_2": ["y" * 20]}, 10),
        ("embeddings", {"input": {"odd": "shape"}}, 0),  # the replica's to refuse
    ],
)
def test_pooling_requests_are_sized_never_streamed(
    kind: Kind, body: dict[str, Any], tokens: int
) -> None:
    req = parse_request(kind, orjson.dumps({"model": EMBED, **body, "stream": True}), "r")
    assert req.features.prompt_tokens == tokens
    assert req.stream is False and req.features.stream is False
    assert req.features.max_tokens is None
