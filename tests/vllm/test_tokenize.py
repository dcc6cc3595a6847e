"""The gateway tokenizes exactly as the replica does (the precise index depends on it)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from benchmarks.vllm_cpu import VllmFleet
from cache_index.hashing import block_hashes
from gateway.proxy.requests import parse_request
from tests.vllm.conftest import TIMEOUT_S, gateway_for
from vllm_api.chat_template import load_chat_template
from vllm_api.tokenizer import load_tokenizer

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

TEXTS = (
    "hello world",
    " leading space and  double  spaces",
    "Numbers 12345 and 3.14159, punctuation!? (yes) - 'quoted' \"double\"",
    "unicode: café naïve 東京 emoji 🙂 done",
    "line one\nline two\n\n\ttabbed",
    "<|im_start|>user literal special token text<|im_end|>",
    " ".join(["alpha bravo charlie delta echo"] * 40),
)
CHATS: tuple[list[dict[str, Any]], ...] = (
    [{"role": "user", "content": "hello there"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Explain the cache, please: 3 words."},
        {"role": "assistant", "content": "Blocks, hashes, reuse."},
        {"role": "user", "content": "unicode café 🙂 and more"},
    ],
    # Content parts: vLLM joins a message's text parts with newlines.
    [
        {"role": "system", "content": [{"type": "text", "text": "Part one."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first part"},
                {"type": "text", "text": "second part"},
            ],
        },
    ],
)


async def _vllm_ids(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[int]:
    resp = await client.post(url + "/tokenize", json=body)
    assert resp.status_code == 200, resp.text
    tokens: list[int] = resp.json()["tokens"]
    return tokens


async def test_completion_prompts_tokenize_like_the_replica(fleet: VllmFleet) -> None:
    tok = load_tokenizer(str(fleet.model_dir))
    url = fleet.replicas[0].url
    async with httpx.AsyncClient(timeout=30.0) as client:
        for text in TEXTS:
            want = await _vllm_ids(client, url, {"model": fleet.model, "prompt": text})
            assert tok.encode(text) == want, text


async def test_chat_template_renders_and_tokenizes_like_the_replica(fleet: VllmFleet) -> None:
    tok = load_tokenizer(str(fleet.model_dir))
    template = load_chat_template(str(fleet.model_dir))
    url = fleet.replicas[0].url
    async with httpx.AsyncClient(timeout=30.0) as client:
        for messages in CHATS:
            body = {"model": fleet.model, "messages": messages, "add_generation_prompt": True}
            want = await _vllm_ids(client, url, body)
            text = template.render(messages, add_generation_prompt=True)
            # vLLM tokenizes a rendered chat without adding special tokens: the template
            # already holds the BOS.
            assert tok.encode_plain(text) == want  # type: ignore[attr-defined]


async def test_gateway_features_hash_the_replicas_token_ids(fleet: VllmFleet) -> None:
    """What the router sees (token count, block hashes) comes from the replica's own ids."""
    url = fleet.replicas[0].url
    async with gateway_for(fleet) as (gw, _), httpx.AsyncClient(timeout=30.0) as client:
        affinity = gw.runtime.affinity
        cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
            ("completions", {"prompt": t}, {"prompt": t}) for t in TEXTS
        ]
        cases += [("chat", {"messages": m}, {"messages": m}) for m in CHATS]
        for kind, req, tok_req in cases:
            body = orjson.dumps({"model": fleet.model, "max_tokens": 1, **req})
            features = affinity.features(parse_request(kind, body, "rid"), [])  # type: ignore[arg-type]
            want = await _vllm_ids(client, url, {"model": fleet.model, **tok_req})
            assert features.prompt_tokens == len(want), (kind, req)
            assert features.block_hashes == tuple(block_hashes(want, fleet.block_size)), (kind, req)
