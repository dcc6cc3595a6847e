"""SSE framing, byte for byte, of streamed completions and chat completions.

vLLM writes ``f"data: {json}\\n\\n"`` per chunk and ``"data: [DONE]\\n\\n"`` last; the usage
chunk (``stream_options.include_usage``) has ``choices: []``. With
``--enable-prompt-tokens-details`` its ``prompt_tokens_details`` is always there: completions
dump it with ``exclude_unset`` (``{"cached_tokens": N}`` only), chat with ``exclude_none``
(``cached_tokens`` and ``created_cache_tokens``).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.conformance.helpers import (
    Prompts,
    SseStream,
    Target,
    full_blocks,
    parse_sse,
    prompt_of,
    read_stream,
)


def _check_framing(resp: httpx.Response, stream: SseStream) -> None:
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert stream.raw.endswith(b"data: [DONE]\n\n")
    assert stream.done
    assert stream.frames.count(b"data: [DONE]") == 1
    for frame in stream.frames:
        # One "data: " line per frame: no event:/id: fields, comments or CRLF.
        assert frame.startswith(b"data: ") and b"\n" not in frame and b"\r" not in frame, frame
    assert len(stream.chunks) == len(stream.frames) - 1


async def _stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[httpx.Response, SseStream]:
    resp, raw = await read_stream(client, path, body)
    return resp, parse_sse(raw)


async def test_completion_stream_framing(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    body = {
        "model": target.model,
        "prompt": prompts.text(20),
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
    }
    resp, stream = await _stream(client, "/v1/completions", body)
    _check_framing(resp, stream)
    chunks = stream.chunks
    assert chunks, "no content chunk"
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert chunk["model"] == target.model
        assert len(chunk["choices"]) == 1 and chunk["choices"][0]["index"] == 0
        assert isinstance(chunk["choices"][0]["text"], str)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] == "length"
    assert all(r is None for r in reasons[:-1])
    assert not any(c.get("usage") for c in chunks)


async def test_chat_stream_first_delta_and_finish(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompts.text(20)}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
    }
    resp, stream = await _stream(client, "/v1/chat/completions", body)
    _check_framing(resp, stream)
    chunks = stream.chunks
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    assert first.get("finish_reason") is None
    content = [c["choices"][0] for c in chunks[1:]]
    assert content, "no content chunk after the role chunk"
    assert content[-1]["finish_reason"] == "length"
    assert all(c.get("finish_reason") is None for c in content[:-1])
    assert all("role" not in c["delta"] for c in content)
    assert "".join(c["delta"].get("content", "") for c in content)


async def _usage_stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    resp, stream = await _stream(client, path, body)
    _check_framing(resp, stream)
    *content, last = stream.chunks
    assert last["choices"] == []
    assert not any(c.get("usage") for c in content), "usage only on the final chunk"
    assert all(c["choices"] for c in content)
    return last["usage"], content


async def test_completion_include_usage_and_cached_tokens(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 4 * target.block_size)
    body = {"model": target.model, "prompt": text, "max_tokens": 4, "ignore_eos": True}
    usage, _ = await _usage_stream(client, "/v1/completions", body)
    assert usage["prompt_tokens"] == len(ids)
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == len(ids) + 4
    keys = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
    assert list(usage) == keys
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}

    again, _ = await _usage_stream(client, "/v1/completions", body)
    assert list(again) == keys
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert again["prompt_tokens_details"] == {"cached_tokens": cached}
    assert cached > 0 and cached % target.block_size == 0
    assert cached <= len(ids)


async def test_chat_include_usage(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompts.text(60)}],
        "max_tokens": 3,
        "ignore_eos": True,
    }
    usage, content = await _usage_stream(client, "/v1/chat/completions", body)
    assert usage["completion_tokens"] == 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3
    assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    full = full_blocks(usage["prompt_tokens"], target.block_size)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": full}

    again, _ = await _usage_stream(client, "/v1/chat/completions", body)
    assert again["prompt_tokens"] == usage["prompt_tokens"]
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % target.block_size == 0
    assert again["prompt_tokens_details"] == {
        "cached_tokens": cached,
        "created_cache_tokens": full - cached,
    }
