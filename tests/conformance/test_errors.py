"""Error bodies, as vLLM builds them.

From vLLM's source (vllm/entrypoints/openai/engine/serving.py, .../serve/utils/
server_utils.py, vllm/exceptions.py):
- every error is ``ErrorResponse{error: ErrorInfo{message, type, param, code: int}}`` with
  ``code`` = the HTTP status;
- unknown model (``_check_model``): 404, type ``NotFoundError``, param ``"model"``, message
  ``The model `<name>` does not exist.``;
- prompt too long (``_validate_input`` / the renderer): ``VLLMValidationError`` -> 400
  ``BadRequestError``, param ``"input_tokens"``, message ``This model's maximum context
  length is N tokens. However, your request has M input tokens. ... (parameter=input_tokens,
  value=M)``;
- prompt + max_tokens too long: 400 ``BadRequestError``, param ``"max_tokens"``, message
  starting ``'max_tokens' or 'max_completion_tokens' is too large: K.``;
- bad JSON / missing required field: FastAPI's ``RequestValidationError`` ->
  ``validation_exception_handler`` -> 400, type ``HTTPStatus.BAD_REQUEST.phrase`` i.e.
  ``"Bad Request"`` (param: null in older releases, the pydantic location such as
  ``body.messages`` in newer ones);
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
    assert error["type"] == "Bad Request"
    assert error["param"] is None or "messages" in error["param"]


async def test_missing_prompt(client: httpx.AsyncClient, target: Target) -> None:
    resp = await client.post("/v1/completions", json={"model": target.model, "max_tokens": 2})
    error = _error(resp, 400)
    # CompletionRequest's model validator raises ("Either prompt or prompt_embeds must be
    # provided"), which FastAPI turns into a RequestValidationError.
    assert error["type"] == "Bad Request"


async def test_unknown_model(client: httpx.AsyncClient, prompts: Prompts) -> None:
    for path, extra in (
        ("/v1/completions", {"prompt": prompts.text(5)}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        resp = await client.post(path, json={"model": "no-such-model", "max_tokens": 2, **extra})
        error = _error(resp, 404)
        assert error["type"] == "NotFoundError"
        assert error["param"] == "model"
        assert error["message"] == "The model `no-such-model` does not exist."


async def test_prompt_longer_than_max_model_len(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, target.max_model_len + 8)
    resp = await client.post(
        "/v1/completions", json={"model": target.model, "prompt": text, "max_tokens": 2}
    )
    error = _error(resp, 400)
    assert error["type"] == "BadRequestError"
    assert error["param"] == "input_tokens"
    assert f"maximum context length is {target.max_model_len} tokens" in error["message"]
    assert f"{len(ids)} input tokens" in error["message"]
    # str(VLLMValidationError) appends its parameter and value.
    assert error["message"].endswith(f"(parameter=input_tokens, value={len(ids)})")


async def test_max_tokens_too_large(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    text, ids = await prompt_of(client, target, prompts, 8)
    too_many = target.max_model_len - len(ids) + 1
    for path, extra in (
        ("/v1/completions", {"prompt": text}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
    ):
        resp = await client.post(
            path, json={"model": target.model, "max_tokens": too_many, **extra}
        )
        error = _error(resp, 400)
        assert error["type"] == "BadRequestError"
        assert error["param"] == "max_tokens"
        assert error["message"].startswith(
            f"'max_tokens' or 'max_completion_tokens' is too large: {too_many}."
        )
        assert f"maximum context length is {target.max_model_len} tokens" in error["message"]
        assert error["message"].endswith(f"(parameter=max_tokens, value={too_many})")


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
