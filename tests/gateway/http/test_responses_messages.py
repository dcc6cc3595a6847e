"""Responses, Anthropic Messages, count_tokens and tokenize through the gateway, over sockets.

The official SDKs talk to a gateway in front of a simulated fleet (which serves these routes
as vLLM 0.32 does); stored responses must return to the replica that keeps them.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.config import (
    GatewayConfig,
    HealthCheckConfig,
    RoutingConfig,
    ServerConfig,
)
from gateway.process import RunningGateway, running_gateway
from gateway.proxy.affinity import Affinity
from gateway.proxy.requests import parse_request
from routing.profile import BUILTIN_PROFILES
from simulator import SimFleet
from simulator import responses as sim_responses
from tests.gateway.conftest import (
    MODEL,
    SIM,
    InProcessGateway,
    eventually,
    gateway_config,
    in_process,
    set_faults,
)
from vllm_api.chat_template import ChatTemplate

KEY = "sk-gateway-test"
_DECISION = re.compile(
    rb'^llm_gateway_routing_decisions_total\{branch="([^"]+)",replica="([^"]+)"\} (\S+)$', re.M
)
_NO_EOS: Any = {"ignore_eos": True}


@pytest.fixture
async def fleet4() -> AsyncIterator[SimFleet]:
    async with SimFleet(SIM, replicas=4, host="127.0.0.1", base_port=0) as f:
        yield f


def _round_robin(fleet: SimFleet, **overrides: object) -> GatewayConfig:
    # Round robin: without pinning a follow-up would land on another replica 3 times in 4.
    cfg = gateway_config(
        fleet,
        routing=RoutingConfig(profile="round_robin"),
        server=ServerConfig(port=0, api_keys=(KEY,)),
    )
    return replace(cfg, **overrides)  # type: ignore[arg-type]


def _openai(gw: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)


def _anthropic(gw: RunningGateway, key: str = KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0)


def _decisions(gw: InProcessGateway) -> dict[tuple[str, str], float]:
    text = gw.runtime.metrics.render()
    return {(r.decode(), b.decode()): float(n) for b, r, n in _DECISION.findall(text)}


async def _routed(gw: InProcessGateway, path: str, body: dict[str, Any]) -> tuple[str, str]:
    """(replica, branch) that `body` took."""
    before = _decisions(gw)
    r = await gw.client.post(path, json=body)
    assert r.status_code == 200, r.text
    moved = [k for k, n in _decisions(gw).items() if n > before.get(k, 0.0)]
    assert len(moved) == 1, moved
    return moved[0]


async def test_openai_sdk_stored_follow_ups_reach_their_replica(fleet4: SimFleet) -> None:
    async with running_gateway(_round_robin(fleet4)) as gw, _openai(gw) as client:
        first = await client.responses.create(
            model=MODEL,
            input="Remember the word banana",
            instructions="Be brief",
            max_output_tokens=3,
            extra_body=_NO_EOS,
        )
        assert first.id.startswith("resp_") and first.output_text
        ok = 0
        for i in range(100):
            follow = await client.responses.create(
                model=MODEL,
                input=f"What was the word? ({i})",
                previous_response_id=first.id,
                max_output_tokens=2,
                extra_body=_NO_EOS,
            )
            assert follow.previous_response_id == first.id
            assert follow.usage is not None and first.usage is not None
            ok += follow.usage.input_tokens > first.usage.input_tokens
        assert ok == 100
        # A streamed response is remembered from its response.created event.
        stream = await client.responses.create(
            model=MODEL,
            input="stream please",
            max_output_tokens=4,
            stream=True,
            extra_body=_NO_EOS,
        )
        kinds, rid = [], ""
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.created":
                rid = event.response.id
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        for _ in range(8):
            again = await client.responses.create(
                model=MODEL,
                input="and again",
                previous_response_id=rid,
                max_output_tokens=2,
                extra_body=_NO_EOS,
            )
            assert again.previous_response_id == rid
        # Cancel reaches the storing replica: it refuses a finished response (400, not 404).
        with pytest.raises(openai.BadRequestError, match="synchronous"):
            await client.responses.cancel(first.id)
        with pytest.raises(openai.NotFoundError, match="resp_nope"):
            await client.responses.cancel("resp_nope")
        with pytest.raises(openai.NotFoundError, match="resp_nope"):
            await client.responses.create(
                model=MODEL, input="x", previous_response_id="resp_nope", max_output_tokens=2
            )
        # Retrieval reaches the storing replica too (tests/gateway/http/test_routes_stored.py).
        got = await client.responses.retrieve(first.id)
        assert got.id == first.id and got.output_text == first.output_text


async def test_follow_up_after_its_replica_left_gets_a_clear_error(fleet4: SimFleet) -> None:
    cfg = _round_robin(fleet4, health_check=HealthCheckConfig(interval_s=0.05, timeout_s=0.5))
    async with running_gateway(cfg) as gw, _openai(gw) as client:
        made = [
            await client.responses.create(model=MODEL, input=f"hello {i}", max_output_tokens=2)
            for i in range(2)
        ]
        index = gw.runtime.pipeline.responses
        gone, down = (index.get(m.id) for m in made)
        assert gone is not None and down is not None and gone != down  # round robin
        await gw.runtime.remove_replica(gone)
        with pytest.raises(openai.APIStatusError, match="no longer serving") as info:
            await client.responses.create(
                model=MODEL, input="more", previous_response_id=made[0].id, max_output_tokens=2
            )
        assert info.value.status_code == 410
        url = next(r.url for r in fleet4.replicas if r.name == down)
        await set_faults(url, dead=True)
        await eventually(lambda: not gw.runtime.pool[down].healthy, what="marked down")
        with pytest.raises(openai.APIStatusError, match="is down") as info:
            await client.responses.create(
                model=MODEL, input="more", previous_response_id=made[1].id, max_output_tokens=2
            )
        assert info.value.status_code == 503


async def test_anthropic_sdk_messages_through_the_gateway(fleet4: SimFleet) -> None:
    async with running_gateway(_round_robin(fleet4)) as gw, _anthropic(gw) as client:
        msgs: Any = [{"role": "user", "content": "Hello there"}]
        out = await client.messages.create(
            model=MODEL, max_tokens=4, system="Be brief", messages=msgs, extra_body=_NO_EOS
        )
        assert out.role == "assistant" and out.stop_reason == "max_tokens"
        assert out.usage.output_tokens == 4 and out.content[0].type == "text"
        async with client.messages.stream(
            model=MODEL, max_tokens=5, messages=msgs, extra_body=_NO_EOS
        ) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert text and final.content[0].type == "text" and final.content[0].text == text
        counted = await client.messages.count_tokens(model=MODEL, system="Be brief", messages=msgs)
        usage = out.usage
        prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert counted.input_tokens == prompt + (usage.cache_creation_input_tokens or 0)
        # The gateway's own errors, in Anthropic's shape the SDK maps to its classes.
        with pytest.raises(anthropic.NotFoundError, match="nope"):
            await client.messages.create(model="nope", max_tokens=4, messages=msgs)
        async with _anthropic(gw, "sk-wrong") as bad:
            with pytest.raises(anthropic.AuthenticationError):
                await bad.messages.create(model=MODEL, max_tokens=4, messages=msgs)
    async with running_gateway(_round_robin(fleet4)) as gw, httpx.AsyncClient() as raw:
        body = {"model": "nope", "max_tokens": 4, "messages": msgs}
        r = await raw.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": KEY})
        assert r.status_code == 404
        assert r.json() == {
            "type": "error",
            "error": {"type": "NotFoundError", "message": "The model `nope` does not exist."},
        }
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = await raw.post(gw.url + path, json=body, headers={"x-api-key": "sk-wrong"})
            assert r.status_code == 401 and r.json()["type"] == "error"
            assert r.json()["error"]["message"] == "Invalid or missing API key."
        big = {**body, "system": "x" * (gw.runtime.config.server.max_body_bytes + 1)}
        r = await raw.post(gw.url + "/v1/messages", json=big, headers={"x-api-key": KEY})
        assert r.status_code == 413 and r.json()["type"] == "error"
        # The OpenAI routes keep vLLM's shape (x-api-key works there too).
        chat = {"model": "nope", "messages": msgs}
        r = await raw.post(gw.url + "/v1/chat/completions", json=chat, headers={"x-api-key": KEY})
        assert r.status_code == 404 and r.json()["error"]["code"] == 404


async def test_tokenize_and_detokenize_need_the_gateways_key(fleet4: SimFleet) -> None:
    async with running_gateway(_round_robin(fleet4)) as gw, httpx.AsyncClient() as raw:
        body = {"model": MODEL, "prompt": "Hello tokens"}
        r = await raw.post(gw.url + "/tokenize", json=body)
        assert r.status_code == 401
        auth = {"authorization": f"Bearer {KEY}"}
        r = await raw.post(gw.url + "/tokenize", json=body, headers=auth)
        assert r.status_code == 200, r.text
        tokens = r.json()["tokens"]
        assert tokens and r.json()["count"] == len(tokens)
        back = {"model": MODEL, "tokens": tokens}
        r = await raw.post(gw.url + "/detokenize", json=back, headers=auth)
        assert r.status_code == 200 and "Hello tokens" in r.json()["prompt"]
        r = await raw.post(gw.url + "/tokenize", json={"prompt": "x"}, headers=auth)
        assert r.status_code == 400 and "model" in r.json()["error"]["message"]


_SYSTEM = "You are the handbook assistant; answer from the handbook only. " * 12


def _responses(system: str, question: str) -> dict[str, Any]:
    ask = [{"role": "user", "content": question}]
    return {"model": MODEL, "instructions": system, "input": ask, "max_output_tokens": 2}


def _messages(system: str, question: str) -> dict[str, Any]:
    ask = [{"role": "user", "content": question}]
    return {"model": MODEL, "system": system, "messages": ask, "max_tokens": 2}


@pytest.mark.parametrize(("path", "make"), [("/v1/responses", _responses),
                                             ("/v1/messages", _messages)])  # fmt: skip
async def test_a_repeated_prefix_routes_to_the_replica_that_holds_it(
    fleet4: SimFleet, path: str, make: Any
) -> None:
    # The default, cache-aware profile without its share bound: that one lets a short shared
    # prefix's holder take only its share of picks, and two picks are all this test makes.
    default = BUILTIN_PROFILES["default"]
    picker = replace(default.picker, params={**default.picker.params, "share_window": 0})
    profile = replace(default, picker=picker, name="")
    routing = RoutingConfig(profile="unshared", profiles={"unshared": profile})
    cfg = gateway_config(fleet4, routing=routing)
    async with in_process(cfg) as gw:
        replica, branch = await _routed(gw, path, make(_SYSTEM, "First question?"))
        assert branch != "prefix_hit"
        # A new question after the same system prompt: the holder of that prefix takes it.
        assert await _routed(gw, path, make(_SYSTEM, "Second one?")) == (replica, "prefix_hit")


def _sim_text(kind: str, body: dict[str, Any], template: ChatTemplate) -> str:
    if kind == "responses":
        rq = sim_responses._parse(body, MODEL)
        return template.render(sim_responses._messages(rq, None))
    # The gateway and the simulator share vllm_api.anthropic.chat_messages: check it against
    # vLLM's conversion as written out (system blocks joined, billing header dropped, text
    # blocks of a message on separate lines, a user message with no text dropped).
    expected = {
        "Be brief": [
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "hi"},
        ],
        "S1": [
            {"role": "system", "content": "S1S2"},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "c"},
        ],
    }
    system = body["system"]
    return template.render(expected["Be brief" if isinstance(system, str) else "S1"])


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("responses", {"input": "hi", "instructions": "Be brief"}),
        (
            "responses",
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_text", "text": "b"},
                        ],
                    },
                    {"role": "assistant", "content": "c"},
                    {"role": "user", "content": "d"},
                ]
            },
        ),
        ("messages", {"system": "Be brief", "messages": [{"role": "user", "content": "hi"}]}),
        (
            "messages",
            {
                "system": [
                    {"type": "text", "text": "x-anthropic-billing-header: 1"},
                    {"type": "text", "text": "S1"},
                    {"type": "text", "text": "S2"},
                ],
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"role": "user", "content": [{"type": "image"}]},
                    {"role": "assistant", "content": "c"},
                ],
            },
        ),
    ],
)
def test_prompt_text_is_what_the_replica_renders(kind: str, body: dict[str, Any]) -> None:
    affinity = Affinity(GatewayConfig().cache_index, lambda _m: False)
    full = {"model": MODEL, **body}
    req = parse_request(kind, orjson.dumps(full), "r1")  # type: ignore[arg-type]
    assert affinity.prompt_text(req) == _sim_text(kind, full, affinity.template)
    assert affinity.digest(req) is not None
