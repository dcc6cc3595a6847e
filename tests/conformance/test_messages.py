"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) as vLLM 0.32.0
serves it: the request is converted to a chat completion and answered in Anthropic's shape.

Checked against a real replica (tests/vllm):
- a message is ``chatcmpl-<hex>``; the body is dumped without None fields (no
  ``stop_sequence`` unless one matched); ``stop_reason`` ``max_tokens`` / ``stop_sequence`` /
  ``end_turn``;
- ``usage.input_tokens`` excludes ``cache_read_input_tokens`` (prefix-cache hits) and
  ``cache_creation_input_tokens`` (full prompt blocks written); their sum is the chat prompt;
- ``system`` (a string, or text blocks joined as they are) comes first; several text blocks of
  a message reach the template joined by newlines;
- a stream is message_start (usage: the whole prompt, 0 output) content_block_start,
  content_block_delta..., content_block_stop, message_delta (stop reason, final usage),
  message_stop; no ``[DONE]``;
- request validation errors keep vLLM's OpenAI shape (FastAPI's handler); the handler's own
  errors (unknown model, empty conversation, limits) are ``{"type":"error","error":{...}}``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.conformance.helpers import Prompts, Target, full_blocks, read_stream
from vllm_api.anthropic import STREAM_EVENTS
from vllm_api.named_sse import NamedSseParser


def _msgs(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def create(client: httpx.AsyncClient, target: Target, **body: Any) -> dict[str, Any]:
    # Greedy: the tiny model samples EOS at temperature 1, and Messages has no ignore_eos.
    resp = await client.post(
        "/v1/messages", json={"model": target.model, "temperature": 0.0, **body}
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    out: dict[str, Any] = resp.json()
    return out


async def count(client: httpx.AsyncClient, target: Target, **body: Any) -> int:
    resp = await client.post("/v1/messages/count_tokens", json={"model": target.model, **body})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out == {
        "input_tokens": out["input_tokens"],
        "context_management": {"original_input_tokens": out["input_tokens"]},
    }
    return int(out["input_tokens"])


def _prompt_of(usage: dict[str, Any]) -> int:
    return int(usage["input_tokens"] + usage["cache_read_input_tokens"]
               + usage["cache_creation_input_tokens"])  # fmt: skip


async def test_message_shape(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    text = prompts.text(12)
    out = await create(client, target, max_tokens=4, messages=_msgs(text))
    assert list(out) == ["id", "type", "role", "content", "model", "stop_reason", "usage"]
    assert out["id"].startswith("chatcmpl-")
    assert (out["type"], out["role"], out["model"]) == ("message", "assistant", target.model)
    (block,) = out["content"]
    assert block["type"] == "text" and isinstance(block["text"], str) and block["text"]
    assert out["stop_reason"] == "max_tokens"
    usage = out["usage"]
    assert list(usage) == ["input_tokens", "output_tokens", "cache_creation_input_tokens",
                           "cache_read_input_tokens"]  # fmt: skip
    assert usage["output_tokens"] == 4 and usage["cache_read_input_tokens"] == 0
    chat = await client.post("/tokenize", json={"model": target.model, "messages": _msgs(text)})
    assert (
        _prompt_of(usage)
        == chat.json()["count"]
        == await count(client, target, messages=_msgs(text))
    )


async def test_repeated_prefix_is_cached(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    body = {"max_tokens": 2, "system": "Be brief", "messages": _msgs(prompts.text(200))}
    n = await count(client, target, system=body["system"], messages=body["messages"])
    assert n > 4 * target.block_size
    full = full_blocks(n, target.block_size)
    cold = (await create(client, target, **body))["usage"]
    assert (cold["cache_read_input_tokens"], cold["cache_creation_input_tokens"]) == (0, full)
    assert cold["input_tokens"] == n - full
    warm = (await create(client, target, **body))["usage"]
    cached = (n - 1) // target.block_size * target.block_size
    assert warm["cache_read_input_tokens"] == cached
    assert warm["cache_creation_input_tokens"] == full - cached
    assert _prompt_of(warm) == n


async def test_system_and_blocks(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    a, b = prompts.text(6), prompts.text(6)
    as_str = await count(client, target, system=a + b, messages=_msgs("hi"))
    blocks = [{"type": "text", "text": a}, {"type": "text", "text": b}]
    assert await count(client, target, system=blocks, messages=_msgs("hi")) == as_str
    assert as_str > await count(client, target, messages=_msgs("hi"))
    joined = await count(client, target, messages=_msgs(f"{a}\n{b}"))
    in_blocks = [{"role": "user", "content": blocks}]
    assert await count(client, target, messages=in_blocks) == joined
    out = await create(client, target, max_tokens=1, system=blocks, messages=in_blocks)
    assert _prompt_of(out["usage"]) == await count(client, target, system=blocks,
                                                   messages=in_blocks)  # fmt: skip


async def _events(client: httpx.AsyncClient, body: dict[str, Any]) -> list[tuple[str, Any]]:
    resp, raw = await read_stream(client, "/v1/messages", body)
    assert resp.status_code == 200, raw
    assert resp.headers["content-type"].startswith("text/event-stream")
    parser = NamedSseParser()
    events = [(e.name, json.loads(e.data)) for e in parser.feed(raw)]
    assert not parser.pending and b"[DONE]" not in raw
    for name, data in events:
        assert data["type"] == name
    return events


async def test_stream_events(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    text = prompts.text(200)
    n = await count(client, target, messages=_msgs(text))
    body = {"model": target.model, "max_tokens": 4, "messages": _msgs(text), "stream": True,
            "temperature": 0.0}  # fmt: skip
    for _ in range(2):  # cold, then with the prefix cached
        events = await _events(client, body)
        names = [name for name, _ in events]
        deltas = names.count("content_block_delta")
        assert deltas >= 1
        assert names == [*STREAM_EVENTS[:2], *["content_block_delta"] * deltas,
                         *STREAM_EVENTS[3:]]  # fmt: skip
        start = events[0][1]["message"]
        assert start["id"].startswith("chatcmpl-")
        assert start == {
            "id": start["id"],
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": target.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": n, "output_tokens": 0},
        }
        assert events[1][1] == {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta"
                   for name, d in events if name == "content_block_delta")  # fmt: skip
        assert events[-3][1] == {"type": "content_block_stop", "index": 0}
        delta = events[-2][1]
        assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
        assert delta["usage"]["output_tokens"] == 4 and _prompt_of(delta["usage"]) == n
        assert events[-1][1] == {"type": "message_stop"}
    assert delta["usage"]["cache_read_input_tokens"] > 0


async def test_stop_sequence(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    body = {"max_tokens": 24, "temperature": 0.0, "messages": _msgs(prompts.text(20))}
    full = (await create(client, target, **body))["content"][0]["text"]
    assert len(full.strip()) >= 6, f"too little text to pick a stop string from: {full!r}"
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    out = await create(client, target, **body, stop_sequences=[stop])
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", stop)
    assert out["content"][0]["text"] == full[: full.index(stop)]
    events = await _events(client, {"model": target.model, **body, "stream": True,
                                    "stop_sequences": [stop]})  # fmt: skip
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    streamed = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert streamed == full[: full.index(stop)]


async def test_lora_and_history(client: httpx.AsyncClient, target: Target) -> None:
    assert target.lora is not None
    out = await create(client, target, model=target.lora, max_tokens=2, messages=_msgs("Hi"))
    assert out["model"] == target.lora and out["usage"]["output_tokens"] == 2
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    out = await create(client, target, max_tokens=2, messages=turns)
    assert _prompt_of(out["usage"]) == await count(client, target, messages=turns)


def _openai_error(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["type"] == "Bad Request", body
    error: dict[str, Any] = body["error"]
    return error


def _anthropic_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert list(body) == ["type", "error"] and body["type"] == "error", body
    error: dict[str, Any] = body["error"]
    assert list(error) == ["type", "message"]
    return error


async def test_validation_errors_keep_the_openai_shape(
    client: httpx.AsyncClient, target: Target
) -> None:
    m = target.model
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("/v1/messages", {"model": m, "messages": _msgs("Hi")}, "body.max_tokens",
         "{'type': 'missing', 'loc': 'body.max_tokens', 'msg': 'Field required', "
         "'input': '<dict of 2 items>'}"),
        ("/v1/messages", {"model": m, "max_tokens": 4}, "body.messages",
         "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
         "'input': '<dict of 2 items>'}"),
        ("/v1/messages", {"max_tokens": 4, "messages": _msgs("Hi")}, "body.model",
         "{'type': 'missing', 'loc': 'body.model', 'msg': 'Field required', "
         "'input': '<dict of 2 items>'}"),
        ("/v1/messages", {"model": m, "max_tokens": 4, "messages": "Hi"}, "body.messages",
         "{'type': 'list_type', 'loc': 'body.messages', 'msg': 'Input should be a valid list', "
         "'input': 'Hi'}"),
        ("/v1/messages", {"model": m, "max_tokens": 0, "messages": _msgs("Hi")},
         "body.max_tokens", "{'type': 'value_error', 'loc': 'body.max_tokens', 'msg': 'Value "
         "error, max_tokens must be positive', 'input': '0', 'ctx': {'error': "
         "ValueError('max_tokens must be positive')}}"),
        ("/v1/messages", {"model": m, "max_tokens": 4, "messages": [{"role": "bogus",
         "content": "Hi"}]}, "body.messages.0.role", "{'type': 'literal_error', 'loc': "
         "'body.messages.0.role', 'msg': \"Input should be 'user', 'assistant' or 'system'\", "
         "'input': 'bogus', 'ctx': {'expected': \"'user', 'assistant' or 'system'\"}}"),
        ("/v1/messages/count_tokens", {"model": m}, "body.messages",
         "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
         "'input': '<dict of 1 items>'}"),
    ]  # fmt: skip
    for path, body, param, detail in cases:
        error = _openai_error(await client.post(path, json=body))
        assert (error["param"], error["message"]) == (param, f"1 validation error:\n  {detail}")
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        resp = await client.post(path, content=b"{bad",
                                 headers={"content-type": "application/json"})  # fmt: skip
        _openai_error(resp)
    assert (await client.get("/v1/messages")).status_code == 405


async def test_handler_errors_have_the_anthropic_shape(
    client: httpx.AsyncClient, target: Target
) -> None:
    m, max_len = target.model, target.max_model_len
    over = max_len + 1
    cases: list[tuple[str, dict[str, Any], int, str, str]] = [
        ("/v1/messages", {"model": "nope", "max_tokens": 2, "messages": _msgs("Hi")}, 404,
         "NotFoundError", f"The model `nope` does not exist. Valid aliases: {m}."),
        ("/v1/messages", {"model": "nope", "max_tokens": 2, "messages": _msgs("Hi"),
         "stream": True}, 404, "NotFoundError",
         f"The model `nope` does not exist. Valid aliases: {m}."),
        ("/v1/messages/count_tokens", {"model": "nope", "messages": _msgs("Hi")}, 404,
         "NotFoundError", f"The model `nope` does not exist. Valid aliases: {m}."),
        ("/v1/messages", {"model": m, "max_tokens": 4, "messages": []}, 400, "BadRequestError",
         "Cannot apply chat template to an empty conversation. Provide at least one message."),
        ("/v1/messages/count_tokens", {"model": m, "messages": []}, 400, "BadRequestError",
         "Cannot apply chat template to an empty conversation. Provide at least one message."),
        ("/v1/messages", {"model": m, "max_tokens": over, "messages": _msgs("Hi")}, 400,
         "BadRequestError", f"max_completion_tokens={over} cannot be greater than "
         f"max_model_len={max_len}. Please request fewer output tokens. "
         f"(parameter=max_completion_tokens, value={over})"),
        ("/v1/messages", {"model": m, "max_tokens": 4, "messages": _msgs("word " * (max_len + 8))},
         400, "BadRequestError", f"This model's maximum context length is {max_len} tokens. "
         f"However, your prompt contains at least {over} input tokens, which exceeds this limit "
         "even without any output tokens. Please reduce the length of the input prompt. "
         f"(parameter=input_tokens, value={over})"),
    ]  # fmt: skip
    for path, body, status, err_type, message in cases:
        error = _anthropic_error(await client.post(path, json=body), status)
        assert error == {"type": err_type, "message": message}
