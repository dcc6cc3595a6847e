"""A generative replica and the pooling routes (vLLM 0.32's launchers/api_server/routers.py):
the embed, pooling, classify and score routers are attached only when the model supports
their task, so a generative model's server has no such path and Starlette's router answers
404 before any vLLM handler. The gateway turns that 404 into an error naming the route."""

from __future__ import annotations

import httpx
import pytest

from tests.conformance.helpers import Target

_PATHS = ("/v1/embeddings", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank")


@pytest.mark.parametrize("path", _PATHS)
async def test_a_generative_model_serves_no_pooling_route(
    client: httpx.AsyncClient, target: Target, path: str
) -> None:
    r = await client.post(path, json={"model": target.model, "input": "hello"})
    assert r.status_code == 404, r.text
    # Only the status is the interface here (test_errors.py): not vLLM's ErrorResponse.
    assert "error" not in r.json()
