"""Odd client input never crashes a request: a 400 in vLLM's shape, or the replica's answer."""

from __future__ import annotations

import httpx
import pytest

from gateway.config import CacheIndexConfig
from gateway.proxy.affinity import Affinity
from simulator import SimFleet
from tests.gateway.conftest import MODEL, InProcessGateway, gateway_config, in_flight, in_process
from tests.gateway.http.errors import requests_total, vllm_error

CHAT_HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": CHAT_HI, "max_tokens": 4}
TOKENIZERS = ["", "builtin"]  # character blocks, or token ids hashed as the replica's
# Not a shape vLLM's CompletionRequest takes (str | list[str] | list[int] | list[list[int]]),
# or token ids the gateway cannot pack as uint32 (vLLM refuses them as out of vocabulary).
BAD_PROMPTS: list[object] = [
    [None],
    [1.5],
    [[1, 2], None],
    [1, None],
    [1, "a"],
    ["a", 1],
    ["a", None],
    [[1, 2], "a"],
    [[1.5]],
    [[[1]]],
    [{"text": "hi"}],
    {"text": "hi"},
    5,
    True,
    [-1],
    [4294967296],
    [[7], [-1]],
    [1, 2**64],
]


def _config(fleet: SimFleet, tokenizer: str) -> object:
    return gateway_config(fleet, cache_index=CacheIndexConfig(tokenizer=tokenizer))


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
async def test_malformed_prompts_are_400_in_vllm_shape_and_counted(
    fleet: SimFleet, tokenizer: str
) -> None:
    async with in_process(_config(fleet, tokenizer)) as gw:  # type: ignore[arg-type]
        for prompt in BAD_PROMPTS:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            error = vllm_error(await gw.client.post("/v1/completions", json=body), 400)
            assert (error["type"], error["param"]) == ("BadRequestError", "prompt"), prompt
        assert requests_total(gw.runtime, status="400", model="_unknown") == len(BAD_PROMPTS)
        assert sum(rep.requests_total for rep in gw.runtime.pool) == 0  # refused, not forwarded


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
async def test_every_prompt_shape_vllm_takes_is_forwarded(fleet: SimFleet, tokenizer: str) -> None:
    # The simulated replica serves a batch of one prompt and answers a longer batch itself.
    served = ["Once upon a time", ["Once upon a time"], [300, 301, 302], [[300, 301]], [True, 7]]
    batches = [["one", "two"], [[300], [301, 302]], [[]]]
    async with in_process(_config(fleet, tokenizer)) as gw:  # type: ignore[arg-type]
        for prompt in served:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            r = await gw.client.post("/v1/completions", json=body)
            assert r.status_code == 200, (prompt, r.text)
        for prompt in batches:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            vllm_error(await gw.client.post("/v1/completions", json=body), 400)
        assert sum(rep.requests_total for rep in gw.runtime.pool) == len(served) + len(batches)
        assert in_flight(gw) == {"sim-0": 0, "sim-1": 0}


ODD_MESSAGES: list[object] = [
    [{"role": "user", "content": None}],
    [{"role": "user", "content": [1, None, {"type": "text", "text": 5}, {"type": "image"}]}],
    [{"role": "user", "content": {"nested": [{"junk": True}]}}],
    [{"role": None, "content": "hi"}],
    [{"content": "hi"}],
    [{"role": "user", "content": "hi", "tool_calls": [None]}],
    ["hello"],
    [None],
    [[{"role": "user", "content": "hi"}]],
    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
]


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
async def test_odd_chat_messages_get_the_replicas_answer(fleet: SimFleet, tokenizer: str) -> None:
    async with in_process(_config(fleet, tokenizer)) as gw:  # type: ignore[arg-type]
        for messages in ODD_MESSAGES:
            body = {"model": MODEL, "messages": messages, "max_tokens": 4}
            r = await gw.client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                vllm_error(r, 400)  # the replica's judgement, relayed
        # Every one went to a replica: the gateway itself refused none and crashed on none.
        assert sum(rep.requests_total for rep in gw.runtime.pool) == len(ODD_MESSAGES)
        assert in_flight(gw) == {"sim-0": 0, "sim-1": 0}


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("thread_above_tokens", [4096, 0])  # on the loop, or in a thread
async def test_a_failure_computing_features_routes_by_load(
    fleet: SimFleet, tokenizer: str, thread_above_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: Affinity, *args: object) -> object:
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(Affinity, "_hashes", boom)
    monkeypatch.setattr("gateway.proxy.affinity._THREAD_ABOVE_TOKENS", thread_above_tokens)
    bodies = [
        ("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}),
        ("/v1/completions", {"model": MODEL, "prompt": [300, 301, 302], "max_tokens": 4}),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT_HI, "max_tokens": 4}),
    ]
    async with in_process(_config(fleet, tokenizer)) as gw:  # type: ignore[arg-type]
        for path, body in bodies:
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, r.text
        assert requests_total(gw.runtime, status="200", branch="miss_by_load") == len(bodies)


async def test_an_unknown_model_is_echoed_bounded(asgi_gateway: InProcessGateway) -> None:
    c = asgi_gateway.client
    name = "m" * 100_000
    body = {"model": name, "prompt": "hi", "max_tokens": 4}
    error = vllm_error(await c.post("/v1/completions", json=body), 404)
    assert error["param"] == "model"
    assert error["message"] == f"The model `{'m' * 256}…` does not exist."
    # A name of ordinary length is quoted whole.
    error = vllm_error(await c.post("/v1/completions", json={**body, "model": "no-such"}), 404)
    assert error["message"] == "The model `no-such` does not exist."


async def test_a_null_stream_is_not_streaming_as_in_vllm(asgi_client: httpx.AsyncClient) -> None:
    # vLLM's `stream: bool | None = False`: null is accepted and means a single JSON answer.
    r = await asgi_client.post("/v1/chat/completions", json={**CHAT, "stream": None})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json()["usage"]["completion_tokens"] == 4
    error = vllm_error(
        await asgi_client.post("/v1/chat/completions", json={**CHAT, "stream": 1}), 400
    )
    assert error["param"] == "stream"
