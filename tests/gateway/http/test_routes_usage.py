"""Token quotas charged from every route's own usage shape: Responses and Messages (bodies and
streams), embeddings and rerank; exactly through the pipeline, and end to end over sockets."""

from __future__ import annotations

from dataclasses import replace

import httpx
import orjson
import pytest

from gateway.config import ServerConfig
from gateway.process import running_gateway
from gateway.proxy.quota import LocalQuotaStore
from gateway.proxy.requests import Kind, ParsedRequest, parse_request, stored_request
from gateway.proxy.tenancy_config import TenancyConfig, TenantConfig
from gateway.proxy.usage import usage_tokens
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, gateway_config
from tests.gateway.fake_upstream import Answer, FakeUpstream
from tests.gateway.proxy.test_quota_settle import TPM, _left, _serve, _setup
from vllm_api import anthropic as A
from vllm_api import responses as R
from vllm_api.pooling import pooling_usage

# 100 prompt tokens (40 of them cache reads, 10 cache writes) and 7 generated: 107 in all.
RESP_USAGE = R.usage_body(100, 40, 10, 7)
MSG_USAGE = A.usage(100, 7, 40, 10)


def _key(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {tenant}-key"}


def _tenants(**tenants: TenantConfig) -> dict[str, TenantConfig]:
    return {name: replace(t, keys=(f"{name}-key",)) for name, t in tenants.items()}


def _event(name: str, data: object) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _split(data: bytes) -> tuple[bytes, bytes]:
    return data[: len(data) // 2], data[len(data) // 2 :]


_RESPONSE = {"id": "resp_1", "object": "response", "output": [], "usage": RESP_USAGE, "user": None}
_CREATED = {"type": "response.created", "response": {**_RESPONSE, "usage": None}}
_COMPLETED = _event("response.completed", {"type": "response.completed", "response": _RESPONSE})
_START = {
    "type": "message_start",
    "message": {"id": "msg_1", "usage": {"input_tokens": 100, "output_tokens": 0}},
}
_DELTA = _event("message_delta", {"type": "message_delta", "usage": MSG_USAGE})


def _req(kind: Kind, stream: bool) -> ParsedRequest:
    body: dict[str, object] = {"model": "m", "stream": stream}
    if kind == "responses":
        body |= {"input": "x" * 400, "max_output_tokens": 500}
    elif kind == "messages":
        body |= {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 500}
    elif kind == "rerank":
        body = {"model": "m", "query": "x" * 200, "documents": ["y" * 200]}
    else:
        body = {"model": "m", "input": ["x" * 400]}
    req = parse_request(kind, orjson.dumps(body), "r")
    return replace(req, features=replace(req.features, tenant="t"))


@pytest.mark.parametrize(
    ("kind", "stream", "answer", "used"),
    [
        ("responses", False, Answer(body=orjson.dumps(_RESPONSE)), 107),
        (
            "responses",
            True,
            Answer(chunks=(_event("response.created", _CREATED), *_split(_COMPLETED))),
            107,
        ),
        ("messages", False, Answer(body=orjson.dumps({"id": "msg_1", "usage": MSG_USAGE})), 107),
        (
            "messages",
            True,
            Answer(
                chunks=(
                    _event("message_start", _START),
                    *_split(_DELTA),
                    _event("message_stop", {}),
                )
            ),
            107,
        ),
        # Cut after message_start: the prompt it reported is charged.
        (
            "messages",
            True,
            Answer(chunks=(_event("message_start", _START),), break_with=ConnectionError),
            100,
        ),
        (
            "embeddings",
            False,
            Answer(body=orjson.dumps({"data": [], "usage": pooling_usage(12)})),
            12,
        ),
        # vLLM's RerankUsage has no completion_tokens.
        (
            "rerank",
            False,
            Answer(body=b'{"results":[],"usage":{"prompt_tokens":12,"total_tokens":12}}'),
            12,
        ),
    ],
)
async def test_quota_is_charged_from_each_routes_usage(
    kind: Kind, stream: bool, answer: Answer, used: int
) -> None:
    pipeline, _, store = _setup(FakeUpstream(default=answer))
    await _serve(pipeline, _req(kind, stream))
    assert _left(store) == pytest.approx(TPM - used)
    assert store.in_flight("t") == 0


@pytest.mark.parametrize("kind", ["response_get", "response_cancel"])
async def test_a_stored_responses_get_or_cancel_charges_nothing(kind: Kind) -> None:
    # Its answer is the stored response, usage and all: that was charged when it was made.
    upstream = FakeUpstream(default=Answer(body=orjson.dumps(_RESPONSE)))
    pipeline, _, store = _setup(upstream)
    pipeline.responses.put("resp_1", "r1")
    req = stored_request(kind, "resp_1", "r")
    await _serve(pipeline, replace(req, features=replace(req.features, tenant="t")))
    assert upstream.sent[0].url.startswith("http://r1:8000/v1/responses/resp_1")
    assert upstream.sent[0].method == ("GET" if kind == "response_get" else "POST")
    assert _left(store) == pytest.approx(TPM) and store.in_flight("t") == 0


def test_usage_shapes_read_without_a_full_parse() -> None:
    assert usage_tokens(orjson.dumps(_RESPONSE)) == 107
    assert usage_tokens(_COMPLETED) == 107
    assert usage_tokens(orjson.dumps({"usage": MSG_USAGE})) == 107
    # Without prompt-token details vLLM's Messages usage is input and output alone.
    assert usage_tokens(orjson.dumps({"usage": A.usage(90, 5, None, None)})) == 95
    # response.created's null usage, and text that only names the fields, count nothing.
    assert usage_tokens(_event("response.created", _CREATED)) is None
    named = {"text": '"usage":{"input_tokens":5,"output_tokens":1}'}
    assert usage_tokens(orjson.dumps(named)) is None


async def test_responses_and_messages_charge_the_tenants_quota_over_sockets() -> None:
    # 1000 tokens a minute; each call reserves its prompt + 600 and the simulator stops after 4:
    # only the usage of the answers (about 20 each) lets six calls fit in the minute.
    tenancy = TenancyConfig(tenants=_tenants(t=TenantConfig(tokens_per_minute=1000)))
    sim = replace(SIM, eos_after_tokens=4)
    responses = {"model": MODEL, "input": "Hi there", "max_output_tokens": 600}
    messages = {
        "model": MODEL,
        "max_tokens": 600,
        "messages": [{"role": "user", "content": "Hi there"}],
    }
    async with SimFleet(sim, replicas=2, host="127.0.0.1", base_port=0) as fleet:
        cfg = gateway_config(fleet, tenancy=tenancy, server=ServerConfig(port=0))
        async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            for stream in (False, True, False):
                for path, body in (("/v1/responses", responses), ("/v1/messages", messages)):
                    r = await c.post(path, json={**body, "stream": stream}, headers=_key("t"))
                    assert r.status_code == 200, (path, stream, r.text)
                    assert b"usage" in r.content
            store = gw.runtime.tenancy.store
            assert isinstance(store, LocalQuotaStore)
            # The answers' usage was charged, not their reservations: room for one more.
            level = store.counters("t", gw.runtime.tenancy.tenant("t").limits, 0.0).tokens.level
            assert 600 < level < 1000 - 6 * 10
