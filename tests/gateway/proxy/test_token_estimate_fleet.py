"""Without a tokenizer the gateway learns characters per token from the replicas' usage."""

from __future__ import annotations

import httpx
import orjson

from gateway.process import RunningGateway
from gateway.proxy.requests import parse_request
from gateway.proxy.token_estimate import DEFAULT_CHARS_PER_TOKEN
from tests.gateway.conftest import MODEL


def _messages(i: int) -> list[dict[str, str]]:
    # Long, distinct prompts in short words: the simulator's tokenizer makes ~1 token a word.
    return [{"role": "user", "content": " ".join(f"w{i}x{j}" for j in range(400))}]


def _chat(i: int, stream: bool) -> dict[str, object]:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": _messages(i),
        "max_tokens": 2,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def test_the_estimate_follows_the_replicas_counts(
    gateway: RunningGateway, client: httpx.AsyncClient
) -> None:
    affinity = gateway.runtime.affinity
    assert affinity.tokenizer is None
    assert affinity.chars_per_token.ratio(MODEL) == DEFAULT_CHARS_PER_TOKEN
    counted = chars = 0
    for i in range(6):  # non-streamed answers and streams with a usage chunk alike
        body = _chat(i, stream=i % 2 == 1)
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200
        lines = [ln for ln in resp.text.splitlines() if ln.startswith("data: {")]
        answer = orjson.loads(lines[-1][6:]) if body["stream"] else resp.json()
        counted += answer["usage"]["prompt_tokens"]
        chars += len(affinity.template.render(_messages(i), add_generation_prompt=True))
    ratio = affinity.chars_per_token.ratio(MODEL)
    assert ratio == chars / counted and abs(ratio - DEFAULT_CHARS_PER_TOKEN) > 1.0
    # The next request's estimates use it: its tokens and each block's tokens.
    parsed = parse_request("chat", orjson.dumps(_chat(99, stream=False)), "r")
    features = affinity.features(parsed, [])
    text = affinity.template.render(_messages(99), add_generation_prompt=True)
    assert features.prompt_tokens == int(len(text) / ratio)
    assert features.block_tokens == round(affinity.cfg.block_chars / ratio)
    assert features.prompt_chars == len(text)


async def test_a_stream_without_usage_teaches_nothing(
    gateway: RunningGateway, client: httpx.AsyncClient
) -> None:
    affinity = gateway.runtime.affinity
    for i in range(6):
        body = {**_chat(i, stream=True)}
        body.pop("stream_options")
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200 and "[DONE]" in resp.text
    assert affinity.chars_per_token.ratio(MODEL) == DEFAULT_CHARS_PER_TOKEN
