"""The pooling routes as vLLM 0.32 serves them (vllm/entrypoints/pooling/).

A generative replica (launchers/api_server/routers.py): the embed, pooling, classify and
score routers are attached only when the model supports their task, so its server has no
such path and Starlette's router answers 404 before any vLLM handler. The gateway turns
that 404 into an error naming the route.

A pooling replica (the tiny model run with ``--runner pooling --convert embed``, or the
simulator with runner="pooling"): /v1/embeddings, /pooling (its own task, embed, only),
/score and /v1/score (cosine similarity), /rerank /v1/rerank /v2/rerank; no /classify (the
model's pooling task is embed) and no generation route. vLLM lists its supported tasks from
a set, so their order in the refusal of another task changes with the process's hash seed.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import httpx
import pytest

from tests.conformance.helpers import Target, tokenize
from vllm_api.pooling import decode_base64

_PATHS = ("/v1/embeddings", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank")
# Float32 vectors on real vLLM (the simulator's are exact): what "the same vector" allows.
_TOL = 1e-4


@pytest.mark.parametrize("path", _PATHS)
async def test_a_generative_model_serves_no_pooling_route(
    client: httpx.AsyncClient, target: Target, path: str
) -> None:
    r = await client.post(path, json={"model": target.model, "input": "hello"})
    assert r.status_code == 404, r.text
    # Only the status is the interface here (test_errors.py): not vLLM's ErrorResponse.
    assert "error" not in r.json()


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < _TOL for x, y in zip(a, b, strict=True))


async def _ok(c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    out: dict[str, Any] = r.json()
    return out


async def _error(c: httpx.AsyncClient, path: str, body: dict[str, Any], status: int) -> Any:
    r = await c.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()["error"]


async def test_embeddings_of_every_input_shape(
    pooling_client: httpx.AsyncClient, pooling_target: Target
) -> None:
    c, model = pooling_client, pooling_target.model
    out = await _ok(c, "/v1/embeddings", {"model": model, "input": ["hello", "world"]})
    assert list(out) == ["id", "object", "created", "model", "data", "usage"]
    assert out["object"] == "list" and out["model"] == model and out["id"].startswith("embd-")
    assert [d["index"] for d in out["data"]] == [0, 1]
    assert [d["object"] for d in out["data"]] == ["embedding"] * 2
    vectors = [d["embedding"] for d in out["data"]]
    assert len(vectors[0]) == len(vectors[1]) > 0 and not _close(vectors[0], vectors[1])
    assert all(abs(_norm(v) - 1.0) < _TOL for v in vectors)  # normalised by default
    usage = out["usage"]
    assert usage == {"prompt_tokens": usage["prompt_tokens"], "total_tokens":
                     usage["prompt_tokens"], "completion_tokens": 0,
                     "prompt_tokens_details": None, "completion_tokens_details": None}  # fmt: skip
    hello = await tokenize(c, pooling_target, "hello")
    world = await tokenize(c, pooling_target, "world")
    assert usage["prompt_tokens"] == len(hello) + len(world)
    # One string alone embeds as in a batch; its token ids embed as its text does.
    one = await _ok(c, "/v1/embeddings", {"input": "hello"})
    assert one["model"] == model and _close(one["data"][0]["embedding"], vectors[0])
    by_ids = await _ok(c, "/v1/embeddings", {"model": model, "input": hello})
    assert _close(by_ids["data"][0]["embedding"], vectors[0])
    assert by_ids["usage"]["prompt_tokens"] == len(hello)
    batch = await _ok(c, "/v1/embeddings", {"input": [hello, hello[:1]]})
    assert len(batch["data"]) == 2 and _close(batch["data"][0]["embedding"], vectors[0])
    assert batch["usage"]["prompt_tokens"] == len(hello) + 1
    # A conversation, in `messages` or in `input`: one vector.
    chat = [{"role": "user", "content": "hello"}]
    for body in ({"messages": chat}, {"input": chat}):
        conv = await _ok(c, "/v1/embeddings", body)
        assert len(conv["data"]) == 1 and len(conv["data"][0]["embedding"]) == len(vectors[0])
    # The request id the gateway sends names the answer.
    r = await c.post("/v1/embeddings", json={"input": "a"}, headers={"x-request-id": "q1"})
    assert r.status_code == 200 and r.json()["id"] == "embd-q1"
    # `stream` is an unknown field to vLLM's request model: one JSON body.
    await _ok(c, "/v1/embeddings", {"input": "hello", "stream": True})


async def test_base64_and_activation(pooling_client: httpx.AsyncClient) -> None:
    c = pooling_client
    vector = (await _ok(c, "/v1/embeddings", {"input": "vectors"}))["data"][0]["embedding"]
    b64 = await _ok(c, "/v1/embeddings", {"input": "vectors", "encoding_format": "base64"})
    encoded = b64["data"][0]["embedding"]
    assert isinstance(encoded, str) and _close(decode_base64(encoded), vector)
    big = {"input": "vectors", "encoding_format": "base64", "endianness": "big"}
    swapped = (await _ok(c, "/v1/embeddings", big))["data"][0]["embedding"]
    assert _close(decode_base64(swapped, endianness="big"), vector)
    raw = await _ok(c, "/v1/embeddings", {"input": "vectors", "use_activation": False})
    assert abs(_norm(raw["data"][0]["embedding"]) - 1.0) > 1e-3


async def test_embedding_errors(pooling_client: httpx.AsyncClient, pooling_target: Target) -> None:
    c, model, max_len = pooling_client, pooling_target.model, pooling_target.max_model_len
    # An unknown model: vLLM's pooling check, without the aliases its generation routes list.
    assert await _error(c, "/v1/embeddings", {"model": "nope", "input": "x"}, 404) == {
        "message": "The model `nope` does not exist.", "type": "NotFoundError",
        "param": None, "code": 404,
    }  # fmt: skip
    err = await _error(c, "/v1/embeddings", {"input": "x", "dimensions": 8}, 400)
    assert err == {
        "message": f"Model {model!r} does not support Matryoshka embeddings; dimensions must "
        "be unset (received dimensions=8).", "type": "BadRequestError", "param": None,
        "code": 400,
    }  # fmt: skip
    err = await _error(c, "/v1/embeddings", {"input": []}, 400)
    assert err["message"] == "You must pass at least one prompt"
    err = await _error(c, "/v1/embeddings", {"input": "x", "normalize": True}, 400)
    assert err["message"] == (
        "Parameter `normalize` was removed; use `use_activation` instead. (parameter=normalize)"
    )
    assert err["param"] == "normalize"
    err = await _error(c, "/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 400)
    assert "Input should be 'float', 'base64', 'bytes' or 'bytes_only'" in err["message"]
    assert "Field required" in (await _error(c, "/v1/embeddings", {}, 400))["message"]
    # Token ids count in full; text is cut at max_len + 1 tokens: "at least" either way here.
    limit = (
        f"This model's maximum context length is {max_len} tokens. However, your prompt "
        f"contains at least {max_len + 1} input tokens, which exceeds this limit even without "
        f"any output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={max_len + 1})"
    )
    for long in (list(range(max_len + 1)), " ".join(["alpha"] * (max_len + 50))):
        err = await _error(c, "/v1/embeddings", {"input": long}, 400)
        assert err["message"] == limit and err["param"] == "input_tokens"


async def test_pooling_route_and_its_tasks(
    pooling_client: httpx.AsyncClient, pooling_target: Target
) -> None:
    c = pooling_client
    out = await _ok(c, "/pooling", {"model": pooling_target.model, "input": "pool me"})
    assert list(out) == ["id", "object", "created", "model", "data", "usage"]
    assert out["id"].startswith("pooling-") and out["data"][0]["object"] == "pooling"
    emb = (await _ok(c, "/v1/embeddings", {"input": "pool me"}))["data"][0]["embedding"]
    assert _close(out["data"][0]["data"], emb)
    err = await _error(c, "/pooling", {"input": "x", "task": "classify"}, 400)
    head, tail = err["message"].split(" Supported tasks: ")
    assert head == "Unsupported task: 'classify'" and err["param"] == "task"
    tasks, suffix = tail.rsplit(" ", 1)
    assert sorted(ast.literal_eval(tasks)) == ["embed", "token_embed"]
    assert suffix == "(parameter=task)"
    err = await _error(c, "/pooling", {"input": "x", "task": "token_embed"}, 400)
    assert err["message"] == (
        "Try switching the model's pooling_task via --pooler-config.task token_embed. "
        "(parameter=task)"
    )
    err = await _error(c, "/pooling", {"input": "x", "dimensions": 4}, 400)
    assert err["message"] == "dimensions is currently not supported (parameter=dimensions)"


async def test_score_and_rerank_by_cosine_similarity(
    pooling_client: httpx.AsyncClient, pooling_target: Target
) -> None:
    c, model = pooling_client, pooling_target.model
    per_text = len(await tokenize(c, pooling_target, "a"))
    assert per_text == len(await tokenize(c, pooling_target, "b"))
    for path in ("/score", "/v1/score"):
        out = await _ok(c, path, {"model": model, "text_1": "a", "text_2": ["a", "b"]})
        assert list(out) == ["id", "object", "created", "model", "data", "usage"]
        assert out["id"].startswith("score-") and out["model"] == model
        assert [(d["index"], d["object"]) for d in out["data"]] == [(0, "score"), (1, "score")]
        same, other = (d["score"] for d in out["data"])
        assert abs(same - 1.0) < _TOL and other < same
        # The query is embedded once: 3 texts for 1:N of 2.
        assert out["usage"]["prompt_tokens"] == out["usage"]["total_tokens"] == 3 * per_text
    err = await _error(c, "/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, 400)
    assert err["message"] == "Input lengths must be either 1:1, 1:N or N:N"
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = {"model": model, "query": "a", "documents": ["b", "a", "c"]}
        ranked = await _ok(c, path, body)
        assert list(ranked) == ["id", "model", "usage", "results"]
        assert ranked["usage"] == {"prompt_tokens": 4 * per_text, "total_tokens": 4 * per_text}
        results = ranked["results"]
        assert [r["index"] for r in results][:1] == [1] and len(results) == 3
        assert results[0]["document"] == {"text": "a", "multi_modal": None}
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        top = await _ok(c, path, {**body, "top_n": 2})
        assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]


_NOT_SERVED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
               "/classify")  # fmt: skip


@pytest.mark.parametrize("path", _NOT_SERVED)
async def test_a_pooling_model_serves_no_generation_or_classify_route(
    pooling_client: httpx.AsyncClient, pooling_target: Target, path: str
) -> None:
    body = {"model": pooling_target.model, "input": "x", "prompt": "x",
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}  # fmt: skip
    r = await pooling_client.post(path, json=body)
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}, r.text
