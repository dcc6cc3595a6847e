"""A pooling replica (vLLM --runner pooling): /v1/embeddings and /pooling as vLLM 0.32 serves
them, and a generative replica that answers them as vLLM does (no such route)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from simulator import SimConfig, SimFleet
from vllm_api.pooling import decode_base64

EMBED = SimConfig(model="sim-embed", runner="pooling", kv_events=False, time_scale=50.0, seed=3)


@pytest.fixture
async def embed_fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(EMBED, replicas=2, host="127.0.0.1", base_port=0) as f:
        yield f


async def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.post(url + path, json=body)


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


async def test_embeddings_of_every_input_shape(embed_fleet: SimFleet) -> None:
    url = embed_fleet.replicas[0].url
    r = await _post(url, "/v1/embeddings", {"model": "sim-embed", "input": ["hello", "world"]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert list(out) == ["id", "object", "created", "model", "data", "usage"]
    assert out["object"] == "list" and out["model"] == "sim-embed" and out["id"].startswith("embd-")
    assert [d["index"] for d in out["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in out["data"])
    vectors = [d["embedding"] for d in out["data"]]
    assert all(len(v) == EMBED.embedding_size for v in vectors) and vectors[0] != vectors[1]
    assert all(abs(_norm(v) - 1.0) < 1e-9 for v in vectors)  # normalised by default
    usage = out["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens_details"] is None
    assert usage["completion_tokens_details"] is None
    # An unknown model: vLLM's pooling check, without the aliases its generation routes list.
    r = await _post(url, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "The model `nope` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    # One string alone embeds as it did in a batch; token ids embed as their text does.
    one = (await _post(url, "/v1/embeddings", {"input": "hello"})).json()
    assert one["data"][0]["embedding"] == vectors[0]
    tok = await _post(url, "/tokenize", {"model": "sim-embed", "prompt": "hello"})
    ids = tok.json()["tokens"]
    by_ids = (await _post(url, "/v1/embeddings", {"input": ids})).json()
    assert by_ids["data"][0]["embedding"] == vectors[0]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    batch = (await _post(url, "/v1/embeddings", {"input": [ids, ids[:1]]})).json()
    assert len(batch["data"]) == 2 and batch["data"][0]["embedding"] == vectors[0]
    assert batch["usage"]["prompt_tokens"] == len(ids) + 1
    # Another replica derives the same vector from the same ids.
    other = embed_fleet.replicas[1].url
    again = (await _post(other, "/v1/embeddings", {"input": "hello"})).json()
    assert again["data"][0]["embedding"] == vectors[0]
    # The request id the gateway sends names the answer, as vLLM's X-Request-Id does.
    async with httpx.AsyncClient(timeout=10) as c:
        rid = {"x-request-id": "q1"}
        r = await c.post(url + "/v1/embeddings", json={"input": "a"}, headers=rid)
    assert r.json()["id"] == "embd-q1"


async def test_base64_dimensions_and_activation(embed_fleet: SimFleet) -> None:
    url = embed_fleet.replicas[0].url
    plain = (await _post(url, "/v1/embeddings", {"input": "vectors"})).json()
    vector = plain["data"][0]["embedding"]
    b64 = await _post(url, "/v1/embeddings", {"input": "vectors", "encoding_format": "base64"})
    encoded = b64.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    assert all(abs(a - b) < 1e-6 for a, b in zip(decode_base64(encoded), vector, strict=True))
    big = {"input": "vectors", "encoding_format": "base64", "endianness": "big"}
    swapped = (await _post(url, "/v1/embeddings", big)).json()["data"][0]["embedding"]
    assert decode_base64(swapped, endianness="big") == decode_base64(encoded)
    raw = await _post(url, "/v1/embeddings", {"input": "vectors", "use_activation": False})
    assert abs(_norm(raw.json()["data"][0]["embedding"]) - 1.0) > 1e-3
    # Not a Matryoshka model: vLLM refuses `dimensions` with its message.
    r = await _post(url, "/v1/embeddings", {"input": "x", "dimensions": 8})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and "does not support Matryoshka" in err["message"]
    for bad, word in (({"input": []}, "at least one prompt"), ({"input": "x", "normalize": True},
                      "use_activation"), ({"input": "x", "encoding_format": "hex"}, "base64"),
                      ({}, "Field required")):  # fmt: skip
        r = await _post(url, "/v1/embeddings", bad)
        assert r.status_code == 400 and word in r.json()["error"]["message"], (bad, r.text)
    r = await _post(url, "/v1/embeddings", {"input": list(range(EMBED.max_model_len + 1))})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    # vLLM takes `stream` as an unknown field and answers one body.
    r = await _post(url, "/v1/embeddings", {"input": "x", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")


async def test_matryoshka_dimensions_cut_then_normalise() -> None:
    cfg = replace(EMBED, matryoshka=True, embedding_size=32)
    async with SimFleet(cfg, replicas=1, host="127.0.0.1", base_port=0) as fleet:
        url = fleet.replicas[0].url
        full = (await _post(url, "/v1/embeddings", {"input": "m"})).json()["data"][0]
        cut = (await _post(url, "/v1/embeddings", {"input": "m", "dimensions": 8})).json()
        v = cut["data"][0]["embedding"]
        assert len(v) == 8 and abs(_norm(v) - 1.0) < 1e-9
        head = full["embedding"][:8]
        assert all(abs(a - b / _norm(head)) < 1e-9 for a, b in zip(v, head, strict=True))
        r = await _post(url, "/v1/embeddings", {"input": "m", "dimensions": 33})
        assert r.status_code == 400 and "range [1, 32]" in r.json()["error"]["message"]


async def test_pooling_route_and_its_tasks(embed_fleet: SimFleet) -> None:
    url = embed_fleet.replicas[0].url
    r = await _post(url, "/pooling", {"model": "sim-embed", "input": "pool me"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"].startswith("pooling-") and out["data"][0]["object"] == "pooling"
    emb = (await _post(url, "/v1/embeddings", {"input": "pool me"})).json()["data"][0]
    assert out["data"][0]["data"] == emb["embedding"]
    # vLLM 0.32's words (checked against it serving the tiny model with --convert embed).
    refusals = {
        "classify": "Unsupported task: 'classify' Supported tasks: ['token_embed', 'embed']"
        " (parameter=task)",
        "token_embed": "Try switching the model's pooling_task via --pooler-config.task "
        "token_embed. (parameter=task)",
    }
    for task, message in refusals.items():
        r = await _post(url, "/pooling", {"input": "x", "task": task})
        assert r.status_code == 400 and r.json()["error"]["message"] == message
        assert r.json()["error"]["param"] == "task"
    r = await _post(url, "/pooling", {"input": "x", "dimensions": 4})
    assert r.status_code == 400
    assert (
        r.json()["error"]["message"]
        == "dimensions is currently not supported (parameter=dimensions)"
    )
    # A pooling model serves no generation route: FastAPI's 404, as vLLM attaches none.
    r = await _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}


async def test_a_generative_replica_has_no_pooling_routes() -> None:
    async with SimFleet(SimConfig(kv_events=False), replicas=1, host="127.0.0.1") as fleet:
        for path in ("/v1/embeddings", "/pooling"):
            r = await _post(fleet.replicas[0].url, path, {"input": "x"})
            assert r.status_code == 404 and r.json() == {"detail": "Not Found"}


async def test_openai_sdk_embeddings_against_a_pooling_replica(embed_fleet: SimFleet) -> None:
    base = embed_fleet.replicas[0].url + "/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key="sk", max_retries=0) as client:
        # The SDK asks for base64 by default and decodes it to floats itself.
        out = await client.embeddings.create(model="sim-embed", input=["one", "two"])
        assert [d.index for d in out.data] == [0, 1] and len(out.data[0].embedding) == 64
        floats = await client.embeddings.create(
            model="sim-embed", input="one", encoding_format="float"
        )
        got, want = out.data[0].embedding, floats.data[0].embedding
        assert all(abs(a - b) < 1e-6 for a, b in zip(got, want, strict=True))
        assert out.usage.prompt_tokens == out.usage.total_tokens > 0


async def test_score_and_rerank_by_cosine_similarity(embed_fleet: SimFleet) -> None:
    url = embed_fleet.replicas[0].url
    r = await _post(url, "/score", {"model": "sim-embed", "text_1": "a", "text_2": ["a", "b"]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert list(out) == ["id", "object", "created", "model", "data", "usage"]
    assert out["id"].startswith("score-") and [d["object"] for d in out["data"]] == ["score"] * 2
    same, other = (d["score"] for d in out["data"])
    assert abs(same - 1.0) < 1e-9 and other < same
    # The query is embedded once (vLLM's usage: 3 texts for 1:N of 2).
    one = (await _post(url, "/tokenize", {"prompt": "a"})).json()["count"]
    assert out["usage"]["prompt_tokens"] == 3 * one
    body = {"query": "a", "documents": ["b", "a", "c"], "top_n": 2}
    ranked = (await _post(url, "/v2/rerank", body)).json()
    assert list(ranked) == ["id", "model", "usage", "results"]
    assert set(ranked["usage"]) == {"prompt_tokens", "total_tokens"}
    results = ranked["results"]
    assert len(results) == 2 and results[0]["index"] == 1
    assert results[0]["document"] == {"text": "a", "multi_modal": None}
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    r = await _post(url, "/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]})
    assert r.status_code == 400
