"""Non-streamed OpenAI routes and the side routes, shape by shape.

Shapes follow vLLM's pydantic models (vllm/entrypoints/openai/*/protocol.py): ids are
``cmpl-<uuid>`` / ``chatcmpl-<uuid>``. With ``--enable-prompt-tokens-details``,
``usage.prompt_tokens_details`` is always an object (``cached_tokens`` 0 on a cold prompt):
completions leave ``created_cache_tokens`` null, chat reports the prompt tokens the request
wrote to the prefix cache (its full blocks less the hits); ``multimodal_tokens`` is null.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.conformance.helpers import (
    Prompts,
    Target,
    cached_tokens,
    complete,
    full_blocks,
    prompt_of,
)


def _check_usage(usage: dict[str, Any], completion_tokens: int) -> None:
    assert list(usage) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]
    assert usage["completion_tokens_details"] is None
    assert isinstance(usage["prompt_tokens"], int) and usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + completion_tokens


async def test_completion_shape(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 3 * target.block_size)
    first = await complete(client, target, text, max_tokens=7)
    assert first["id"].startswith("cmpl-") and len(first["id"]) > len("cmpl-")
    assert first["object"] == "text_completion"
    assert isinstance(first["created"], int) and first["created"] > 1_600_000_000
    assert first["model"] == target.model
    (choice,) = first["choices"]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str)
    assert "logprobs" in choice and choice["logprobs"] is None
    assert choice["finish_reason"] == "length"
    assert "stop_reason" in choice and choice["stop_reason"] is None
    _check_usage(first["usage"], 7)
    assert first["usage"]["prompt_tokens"] == len(ids)
    cold = {"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None}
    assert first["usage"]["prompt_tokens_details"] == cold

    second = await complete(client, target, text, max_tokens=7)
    assert second["id"] != first["id"]
    details = second["usage"]["prompt_tokens_details"]
    cached = details["cached_tokens"]
    assert details == {**cold, "cached_tokens": cached}
    assert cached > 0 and cached % target.block_size == 0


async def test_chat_completion_shape(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompts.text(40)}],
        "max_tokens": 5,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    out = resp.json()
    assert out["id"].startswith("chatcmpl-")
    assert out["object"] == "chat.completion"
    assert isinstance(out["created"], int)
    assert out["model"] == target.model
    (choice,) = out["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert "logprobs" in choice and choice["logprobs"] is None
    assert choice["finish_reason"] == "length"
    assert "stop_reason" in choice
    usage = out["usage"]
    _check_usage(usage, 5)
    full = full_blocks(usage["prompt_tokens"], target.block_size)
    assert usage["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": full,
        "multimodal_tokens": None,
    }

    again = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % target.block_size == 0
    assert again["prompt_tokens_details"] == {
        "cached_tokens": cached,
        "created_cache_tokens": full - cached,
        "multimodal_tokens": None,
    }


async def test_max_tokens_honoured(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    for max_tokens in (1, 13):
        out = await complete(client, target, prompts.text(20), max_tokens=max_tokens)
        assert out["usage"]["completion_tokens"] == max_tokens
        assert out["choices"][0]["finish_reason"] == "length"


async def test_n_choices(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    text = prompts.text(20)
    out = await complete(client, target, text, max_tokens=4, n=3, temperature=1.0, seed=7)
    assert sorted(c["index"] for c in out["choices"]) == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    _check_usage(out["usage"], 12)


async def test_stop_string(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    text = prompts.text(20)
    full = (await complete(client, target, text, max_tokens=24))["choices"][0]["text"]
    assert len(full.strip()) >= 6, f"too little text to pick a stop string from: {full!r}"
    mid = len(full) // 2
    stop = full[mid : mid + 3]
    out = await complete(client, target, text, max_tokens=24, stop=[stop])
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    # vLLM cuts the text before the first occurrence of the stop string.
    assert choice["text"] == full[: full.index(stop)]
    assert out["usage"]["completion_tokens"] < 24


async def test_lora_model_is_accepted(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    assert target.lora is not None, "the target must serve a LoRA adapter"
    body = {"model": target.lora, "prompt": prompts.text(20), "max_tokens": 3, "ignore_eos": True}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == target.lora
    assert resp.json()["usage"]["completion_tokens"] == 3


async def test_models_lists_base_and_lora(client: httpx.AsyncClient, target: Target) -> None:
    resp = await client.get("/v1/models")
    assert resp.status_code == 200
    out = resp.json()
    assert out["object"] == "list"
    by_id = {m["id"]: m for m in out["data"]}
    base = by_id[target.model]
    for card in out["data"]:
        assert set(card) >= {
            "id",
            "object",
            "created",
            "owned_by",
            "root",
            "parent",
            "max_model_len",
            "permission",
        }
        assert card["object"] == "model"
        assert card["owned_by"] == "vllm"
        assert isinstance(card["created"], int)
        assert isinstance(card["permission"], list)
    assert base["parent"] is None
    assert base["max_model_len"] == target.max_model_len
    assert target.lora is not None
    assert by_id[target.lora]["parent"] == target.model


async def test_health_and_ping(client: httpx.AsyncClient) -> None:
    resp = await client.get("/health")
    assert resp.status_code == 200 and resp.content == b""
    for method in ("GET", "POST"):
        ping = await client.request(method, "/ping")
        assert ping.status_code == 200, (method, ping.text)


async def test_version(client: httpx.AsyncClient) -> None:
    resp = await client.get("/version")
    assert resp.status_code == 200
    assert isinstance(resp.json()["version"], str) and resp.json()["version"]


async def test_load(client: httpx.AsyncClient) -> None:
    resp = await client.get("/load")
    assert resp.status_code == 200
    load = resp.json()["server_load"]
    assert isinstance(load, int) and load >= 0


async def test_tokenize(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    text = prompts.text(12)
    resp = await client.post("/tokenize", json={"model": target.model, "prompt": text})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["count"] == len(out["tokens"]) > 0
    assert all(isinstance(t, int) for t in out["tokens"])
    assert out["max_model_len"] == target.max_model_len
    assert out.get("token_strs") is None

    body = {"model": target.model, "prompt": text, "return_token_strs": True}
    with_strs = (await client.post("/tokenize", json=body)).json()
    assert with_strs["tokens"] == out["tokens"]
    assert isinstance(with_strs["token_strs"], list), with_strs
    assert len(with_strs["token_strs"]) == out["count"]
    assert all(isinstance(s, str) for s in with_strs["token_strs"])

    used = await complete(client, target, text, max_tokens=1)
    assert used["usage"]["prompt_tokens"] == out["count"]
    assert cached_tokens(used["usage"]) % target.block_size == 0
