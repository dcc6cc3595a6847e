"""Error bodies, as vLLM 0.32.0 builds them (checked against a real replica, tests/vllm).

- every error is ``ErrorResponse{error: ErrorInfo{message, type, param, code: int}}`` with
  ``code`` = the HTTP status;
- unknown model (``_check_model``): 404 ``NotFoundError``, param ``"model"``, message
  ``The model `<name>` does not exist. Valid aliases: <base served names>.``;
- a ``VLLMValidationError`` is 400 ``BadRequestError`` and its str() appends
  ``(parameter=..., value=...)``: missing/empty prompt, max_tokens > max_model_len
  (TokenizeParams), a prompt over max_model_len (the renderer's length check, after
  tokenizing with truncation at max_model_len + 1), max_tokens < 1 (SamplingParams);
- prompt + max_tokens over max_model_len is not an error: max_tokens is clamped;
- bad JSON / missing required field: FastAPI's ``RequestValidationError`` -> 400, type
  ``"Bad Request"``, param the cleaned pydantic location such as ``body.messages``;
- unknown path / wrong method: Starlette's router answers 404 / 405 before any vLLM handler
  (its handler is bound to FastAPI's HTTPException subclass), so only the status is part of
  the interface.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.conformance.helpers import Prompts, Target, prompt_of


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["code"], int) and not isinstance(error["code"], bool)
    assert error["code"] == status
    return error


async def test_bad_json(client: httpx.AsyncClient) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = await client.post(
            path, content=b'{"model": "x", "prompt": ', headers={"content-type": "application/json"}
        )
        error = _error(resp, 400)
        assert error["type"] == "Bad Request"


async def test_missing_messages(client: httpx.AsyncClient, target: Target) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": target.model, "max_tokens": 2})
    error = _error(resp, 400)
    # FastAPI's RequestValidationError, rendered by vLLM from pydantic's error dicts.
    assert error["type"] == "Bad Request"
    assert error["param"] == "body.messages"
    assert error["message"] == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
        "'msg': 'Field required', 'input': '<dict of 2 items>'}"
    )


async def test_empty_messages(client: httpx.AsyncClient, target: Target) -> None:
    body = {"model": target.model, "messages": [], "max_tokens": 2}
    error = _error(await client.post("/v1/chat/completions", json=body), 400)
    assert (error["type"], error["param"]) == ("BadRequestError", None)
    assert error["message"] == (
        "Cannot apply chat template to an empty conversation. Provide at least one message."
    )


async def test_missing_prompt(client: httpx.AsyncClient, target: Target) -> None:
    # CompletionRequest's model validator raises a VLLMValidationError, which vLLM answers
    # as itself (not as FastAPI's "Bad Request"); an empty string is refused the same way.
    for extra in ({}, {"prompt": ""}):
        body = {"model": target.model, "max_tokens": 2, **extra}
        error = _error(await client.post("/v1/completions", json=body), 400)
        assert (error["type"], error["param"]) == ("BadRequestError", "prompt")
        assert error["message"] == (
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"
        )
    body = {"model": target.model, "max_tokens": 2, "prompt": []}
    error = _error(await client.post("/v1/completions", json=body), 400)
    assert (error["type"], error["param"]) == ("BadRequestError", None)
    assert error["message"] == "You must pass at least one prompt"


async def test_unknown_model(client: httpx.AsyncClient, target: Target, prompts: Prompts) -> None:
    for path, extra in (
        ("/v1/completions", {"prompt": prompts.text(5)}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        resp = await client.post(path, json={"model": "no-such-model", "max_tokens": 2, **extra})
        error = _error(resp, 404)
        assert error["type"] == "NotFoundError"
        assert error["param"] == "model"
        # Only the base model's served names are listed, not the LoRA adapters.
        assert error["message"] == (
            f"The model `no-such-model` does not exist. Valid aliases: {target.model}."
        )


def _too_long(max_model_len: int, count: str) -> str:
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains {count} input tokens, which exceeds this limit even without any output "
        "tokens. Please reduce the length of the input prompt."
    )


async def test_prompt_longer_than_max_model_len(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    n = target.max_model_len
    text, ids = await prompt_of(client, target, prompts, n + 8)
    # Text is tokenized with truncation at max_model_len + 1: the count is "at least" that.
    for path, extra in (
        ("/v1/completions", {"prompt": text}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
    ):
        resp = await client.post(path, json={"model": target.model, "max_tokens": 2, **extra})
        error = _error(resp, 400)
        assert (error["type"], error["param"]) == ("BadRequestError", "input_tokens")
        assert error["message"] == (
            _too_long(n, f"at least {n + 1}") + f" (parameter=input_tokens, value={n + 1})"
        )
    # Token ids are counted in full.
    long_ids = (ids * 2)[: n + 5]
    body = {"model": target.model, "prompt": long_ids, "max_tokens": 2}
    error = _error(await client.post("/v1/completions", json=body), 400)
    assert error["param"] == "input_tokens"
    assert (
        error["message"] == _too_long(n, str(n + 5)) + f" (parameter=input_tokens, value={n + 5})"
    )
    # A prompt of exactly max_model_len leaves no room for output: SamplingParams refuses it.
    body = {"model": target.model, "prompt": ids[:n], "max_tokens": 2}
    error = _error(await client.post("/v1/completions", json=body), 400)
    assert (error["type"], error["param"]) == ("BadRequestError", "max_tokens")
    assert (
        error["message"] == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )


async def test_max_tokens_too_large(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    n = target.max_model_len
    text = prompts.text(8)
    for path, field, extra in (
        ("/v1/completions", "max_tokens", {"prompt": text}),
        ("/v1/chat/completions", "max_tokens", {"messages": [{"role": "user", "content": text}]}),
        (
            "/v1/chat/completions",
            "max_completion_tokens",
            {"messages": [{"role": "user", "content": text}]},
        ),
    ):
        resp = await client.post(path, json={"model": target.model, field: n + 1, **extra})
        error = _error(resp, 400)
        assert (error["type"], error["param"]) == ("BadRequestError", field)
        assert error["message"] == (
            f"{field}={n + 1} cannot be greater than max_model_len={n}. Please request fewer "
            f"output tokens. (parameter={field}, value={n + 1})"
        )


async def test_prompt_plus_max_tokens_over_the_context_is_clamped(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    # Only max_tokens alone above max_model_len is refused: otherwise the output is cut at
    # the end of the context. A long prompt keeps the generation short on a CPU replica.
    n = target.max_model_len
    text, ids = await prompt_of(client, target, prompts, n - 48)
    assert len(ids) < n - 16, len(ids)
    for path, extra in (
        ("/v1/completions", {"prompt": text}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
    ):
        body = {"model": target.model, "max_tokens": n, "ignore_eos": True, **extra}
        resp = await client.post(path, json=body)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert out["choices"][0]["finish_reason"] == "length"
        usage = out["usage"]
        assert usage["total_tokens"] == n
        assert usage["completion_tokens"] == n - usage["prompt_tokens"] > 0


async def test_max_tokens_exactly_fitting_is_accepted(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 8)
    body = {
        "model": target.model,
        "prompt": text,
        "max_tokens": target.max_model_len - len(ids),
        "stream": True,
    }
    # Only validation is under test: the status line is enough, the stream is dropped early.
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for _ in resp.aiter_raw():
            break


async def test_wrong_method(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/completions")).status_code == 405
    assert (await client.get("/v1/chat/completions")).status_code == 405
    assert (await client.post("/v1/models")).status_code == 405


async def test_unknown_path(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/no-such-route")).status_code == 404
    assert (await client.post("/v2/completions", json={})).status_code == 404
