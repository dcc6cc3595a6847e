"""OpenAI routes through the gateway to real vLLM: bodies, streams, and vLLM's own errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from benchmarks.vllm_cpu import VllmFleet
from tests.vllm.conftest import TIMEOUT_S, gateway_for

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]


def _frames(raw: bytes) -> list[bytes]:
    parts = raw.split(b"\n\n")
    assert parts[-1] == b"", f"unterminated SSE frame: {parts[-1]!r:.200}"
    return parts[:-1]


def _chunks(frames: list[bytes]) -> list[dict[str, Any]]:
    assert frames[-1] == b"data: [DONE]"
    return [json.loads(f.removeprefix(b"data: ")) for f in frames[:-1]]


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[bytes]:
    async with client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([c async for c in resp.aiter_raw()])
    return _frames(raw)


async def test_non_streaming_completion_and_chat(fleet: VllmFleet) -> None:
    async with gateway_for(fleet) as (_, client):
        body = {"model": fleet.model, "prompt": "alpha bravo charlie", "max_tokens": 5,
                "ignore_eos": True}  # fmt: skip
        resp = await client.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert out["object"] == "text_completion" and out["model"] == fleet.model
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == 5
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0

        chat = {"model": fleet.model, "messages": [{"role": "user", "content": "hi there"}],
                "max_tokens": 4, "ignore_eos": True}  # fmt: skip
        resp = await client.post("/v1/chat/completions", json=chat)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert out["object"] == "chat.completion"
        assert out["choices"][0]["message"]["role"] == "assistant"
        assert out["usage"]["completion_tokens"] == 4

        lora = {**body, "model": fleet.lora_name}
        resp = await client.post("/v1/completions", json=lora)
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == fleet.lora_name


async def test_streaming_completion_and_chat(fleet: VllmFleet) -> None:
    async with gateway_for(fleet) as (_, client):
        usage_on = {"stream": True, "stream_options": {"include_usage": True}}
        body = {"model": fleet.model, "prompt": "delta echo foxtrot", "max_tokens": 6,
                "ignore_eos": True, **usage_on}  # fmt: skip
        chunks = _chunks(await _stream(client, "/v1/completions", body))
        *content, usage = chunks
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
        assert all(c["object"] == "text_completion" for c in chunks)
        assert content[-1]["choices"][0]["finish_reason"] == "length"

        chat = {"model": fleet.model, "messages": [{"role": "user", "content": "golf hotel"}],
                "max_tokens": 5, "ignore_eos": True, **usage_on}  # fmt: skip
        chunks = _chunks(await _stream(client, "/v1/chat/completions", chat))
        first, *rest, usage = chunks
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert rest[-1]["choices"][0]["finish_reason"] == "length"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def _same_error(
    client: httpx.AsyncClient, direct: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    via_gateway = await client.post(path, json=body)
    straight = await direct.post(path, json=body)
    assert straight.status_code == 400, straight.text
    assert via_gateway.status_code == straight.status_code
    assert via_gateway.headers["content-type"].startswith("application/json")
    assert via_gateway.json() == straight.json()
    error: dict[str, Any] = via_gateway.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    return error


async def test_vllm_errors_are_relayed_in_vllms_shape(fleet: VllmFleet) -> None:
    async with (
        gateway_for(fleet) as (_, client),
        httpx.AsyncClient(base_url=fleet.replicas[0].url, timeout=30.0) as direct,
    ):
        too_many = {"model": fleet.model, "prompt": "hi", "max_tokens": fleet.max_model_len + 1}
        error = await _same_error(client, direct, "/v1/completions", too_many)
        assert error["param"] == "max_tokens"
        too_long = {"model": fleet.model, "prompt": "alpha " * 2 * fleet.max_model_len,
                    "max_tokens": 2}  # fmt: skip
        error = await _same_error(client, direct, "/v1/completions", too_long)
        assert error["param"] == "input_tokens"
        chat = {"model": fleet.model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": fleet.max_model_len + 1}  # fmt: skip
        await _same_error(client, direct, "/v1/chat/completions", chat)

        # The gateway knows the replicas' models: an unknown one gets vLLM's 404 shape.
        resp = await client.post("/v1/completions", json={**too_many, "model": "no-such-model"})
        assert resp.status_code == 404
        error = resp.json()["error"]
        assert error["type"] == "NotFoundError" and error["param"] == "model"
        assert error["code"] == 404
        assert error["message"].startswith("The model `no-such-model` does not exist.")
