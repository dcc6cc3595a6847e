"""The gRPC front end over a real port, in front of the simulated fleet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gateway.grpc.config import GrpcConfig
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.gen import gateway_pb2_grpc as pb_grpc
from gateway.grpc.server import GrpcFrontEnd, running_grpc
from gateway.process import RunningGateway, running_gateway
from routing.router import Router
from simulator import SimFleet
from tests.gateway.conftest import LORA, MODEL, gateway_config, in_flight, set_faults

ZERO = {"sim-0": 0, "sim-1": 0}
STORY = [pb.ChatMessage(role="user", content="Tell me a story")]
LONG_PROMPT = "Once upon a time, in a land of many llamas, there lived a shepherd. " * 8


@dataclass
class Stack:
    gw: RunningGateway
    front: GrpcFrontEnd
    stub: pb_grpc.InferenceStub
    channel: grpc.aio.Channel


@pytest.fixture
async def stack(fleet: SimFleet) -> AsyncIterator[Stack]:
    async with (
        running_gateway(gateway_config(fleet)) as gw,
        running_grpc(gw.runtime, GrpcConfig(enabled=True, port=0)) as front,
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        yield Stack(gw, front, _stub(channel), channel)


def _stub(channel: grpc.aio.Channel) -> pb_grpc.InferenceStub:
    return pb_grpc.InferenceStub(channel)  # type: ignore[no-untyped-call]


async def until(predicate: Callable[[], Any], what: str, timeout: float = 3.0) -> None:  # noqa: ASYNC109
    """Await `predicate()` (sync or async) until truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def running(fleet: SimFleet) -> int:
    return sum(r.engine.num_running for r in fleet.replicas)


async def test_unary_completion_and_chat(stack: Stack) -> None:
    req = pb.CompletionRequest(model=MODEL, text=LONG_PROMPT, max_tokens=8, ignore_eos=True)
    call = stack.stub.Complete(req, metadata=(("x-request-id", "grpc-unary-1"),))
    resp = await call
    assert ("x-request-id", "grpc-unary-1") in tuple(await call.initial_metadata())
    assert resp.model == MODEL and len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.text and choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 8
    # The same prompt again lands on the replica that cached it, which says so.
    again = await stack.stub.Complete(req)
    assert again.usage.cached_tokens > 0 and again.choices[0].text == choice.text

    chat = await stack.stub.Chat(pb.ChatRequest(model=LORA, messages=STORY, max_tokens=4))
    assert chat.model == LORA
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage.completion_tokens <= 4
    assert in_flight(stack.gw) == ZERO


async def test_streaming_completion_and_chat(stack: Stack) -> None:
    req = pb.CompletionRequest(model=MODEL, text=LONG_PROMPT, max_tokens=12)
    unary = await stack.stub.Complete(req)
    stream_req = pb.CompletionRequest()
    stream_req.CopyFrom(req)
    stream_req.include_usage = True
    msgs = [m async for m in stack.stub.StreamComplete(stream_req)]
    assert len(msgs) > 2
    text = "".join(c.text for m in msgs for c in m.choices)
    assert text == unary.choices[0].text
    finished = [c.finish_reason for m in msgs for c in m.choices if c.HasField("finish_reason")]
    assert finished == [unary.choices[0].finish_reason]
    # include_usage: one last message without choices, with usage (and the prefix cache hit).
    assert not msgs[-1].choices and msgs[-1].usage.completion_tokens == 12
    assert msgs[-1].usage.cached_tokens > 0
    assert all(not m.HasField("usage") for m in msgs[:-1])

    chat = pb.ChatRequest(model=MODEL, messages=STORY, max_tokens=16)
    chunks = [m async for m in stack.stub.StreamChat(chat)]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.delta.content for m in chunks for c in m.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert in_flight(stack.gw) == ZERO


async def _over_grpc(stub: pb_grpc.InferenceStub, body: dict[str, Any], session: str) -> None:
    meta = (("x-session-id", session),)
    if "messages" in body:
        msgs = [pb.ChatMessage(**m) for m in body["messages"]]
        chat = pb.ChatRequest(model=MODEL, messages=msgs, max_tokens=6, user="alice")
        if body["stream"]:
            _ = [m async for m in stub.StreamChat(chat, metadata=meta)]
        else:
            await stub.Chat(chat, metadata=meta)
        return
    req = pb.CompletionRequest(model=MODEL, text=body["prompt"], max_tokens=6, user="alice")
    if body["stream"]:
        _ = [m async for m in stub.StreamComplete(req, metadata=meta)]
    else:
        await stub.Complete(req, metadata=meta)


async def test_same_request_is_routed_alike_over_http_and_grpc(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Any, Any, str]] = []
    route = Router.route

    def spy(self: Router, features: Any, *args: Any, **kwargs: Any) -> Any:
        decision = route(self, features, *args, **kwargs)
        # What the cache index knew differs between the two calls; the request must not.
        stable = replace(
            features,
            request_id="",
            prefix_match={},
            prompt_cache_replica=None,
            session_replica=None,
            prefix_home_replica=None,
        )
        seen.append((stable, features, decision.replica.name))
        return decision

    monkeypatch.setattr(Router, "route", spy)
    system = "You are a helpful assistant who knows a great deal about llamas. " * 6
    cases: list[dict[str, Any]] = [
        {"prompt": system + "Question one?", "stream": False},
        {"prompt": system + "Question two?", "stream": True},
    ]
    for i, stream in ((3, False), (4, True)):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"{i}?"}]
        cases.append({"messages": msgs, "stream": stream})
    async with httpx.AsyncClient(base_url=stack.gw.url, timeout=10.0) as http:
        for i, case in enumerate(cases):
            body = {"model": MODEL, "max_tokens": 6, "user": "alice", **case}
            path = "/v1/chat/completions" if "messages" in case else "/v1/completions"
            session = f"s{i}"
            seen.clear()
            # Alternate which front end sees the prompt first: the second must follow the first.
            for front in ("http", "grpc") if i % 2 == 0 else ("grpc", "http"):
                if front == "http":
                    r = await http.post(path, json=body, headers={"x-session-id": session})
                    assert r.status_code == 200
                else:
                    await _over_grpc(stack.stub, body, session)
            (first, _, first_replica), (second, raw, second_replica) = seen
            assert second == first, case
            assert first.session is not None and first.prompt_hash is not None
            assert second_replica == first_replica
            # Same prompt hash computed from both encodings: tier 1 knew where it went.
            assert raw.prompt_cache_replica == first_replica
    assert in_flight(stack.gw) == ZERO


@pytest.mark.parametrize("rpc", ["StreamChat", "Chat"])
async def test_cancelled_call_frees_the_upstream_slot(
    stack: Stack, fleet: SimFleet, rpc: str
) -> None:
    req = pb.ChatRequest(model=MODEL, messages=STORY, max_tokens=4000, ignore_eos=True)
    call = getattr(stack.stub, rpc)(req)
    await until(lambda: running(fleet) == 1, "the replica to start generating")
    if rpc == "StreamChat":
        assert (await call.read()).choices[0].delta.role == "assistant"
    assert call.cancel()
    await until(lambda: running(fleet) == 0, "the replica to abort the request")
    await until(lambda: in_flight(stack.gw) == ZERO, "in-flight back to zero")
    assert call.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await (call.read() if rpc == "StreamChat" else call)


@pytest.mark.parametrize("rpc", ["StreamComplete", "Complete"])
async def test_deadline_exceeded_frees_the_upstream_slot(
    stack: Stack, fleet: SimFleet, rpc: str
) -> None:
    req = pb.CompletionRequest(model=MODEL, text="Go on", max_tokens=4000, ignore_eos=True)
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        call = getattr(stack.stub, rpc)(req, timeout=0.3)
        if rpc == "StreamComplete":
            async for _ in call:
                pass
        else:
            await call
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 2.0
    await until(lambda: running(fleet) == 0, "the replica to abort the request")
    await until(lambda: in_flight(stack.gw) == ZERO, "in-flight back to zero")


async def _status(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        result = call
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    return info.value


async def test_bad_input_is_invalid_argument(stack: Stack) -> None:
    stub = stack.stub
    cases = [
        (stub.Complete(pb.CompletionRequest(model=MODEL)), "`prompt` is required"),
        (stub.Chat(pb.ChatRequest(messages=STORY)), "`model` is required"),
        (stub.StreamChat(pb.ChatRequest(model=MODEL)), "`messages` must be"),
        # Validated by the replica: its 400 message reaches the client unchanged.
        (
            stub.Complete(pb.CompletionRequest(model=MODEL, text="x", max_tokens=100_000)),
            "cannot be greater than max_model_len=8192",
        ),
        (
            stub.StreamComplete(pb.CompletionRequest(model=MODEL, text="x", max_tokens=100_000)),
            "cannot be greater than max_model_len=8192",
        ),
        (
            stub.Complete(
                pb.CompletionRequest(model=MODEL, text="x"), metadata=(("x-priority", "high"),)
            ),
            "`x-priority` metadata must be an integer",
        ),
    ]
    for call, message in cases:
        err = await _status(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert message in (err.details() or "")
        assert any(k == "x-request-id" for k, _ in err.trailing_metadata() or ())
    assert in_flight(stack.gw) == ZERO


async def test_unknown_model_is_not_found(stack: Stack) -> None:
    for call in (
        stack.stub.Complete(pb.CompletionRequest(model="no-such-model", text="hi")),
        stack.stub.StreamChat(pb.ChatRequest(model="no-such-model", messages=STORY)),
    ):
        err = await _status(call)
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert err.details() == "The model `no-such-model` does not exist."


async def test_upstream_errors_map_to_codes_without_leaking_hosts(
    stack: Stack, fleet: SimFleet
) -> None:
    req = pb.CompletionRequest(model=MODEL, text="hi", max_tokens=4)
    for status, code in (
        (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (503, grpc.StatusCode.UNAVAILABLE),
        (500, grpc.StatusCode.UNAVAILABLE),
    ):
        for r in fleet.replicas:
            await set_faults(r.url, error_rate=1.0, error_status=status)
        err = await _status(stack.stub.Complete(req))
        assert err.code() == code, status
        details = err.details() or ""
        for r in fleet.replicas:
            assert r.url.split("//")[1] not in details
        trailers = dict(err.trailing_metadata() or ())
        assert trailers["retry-delay"] == "1s"
    assert in_flight(stack.gw) == ZERO


async def test_failure_after_first_message_ends_stream_with_error(
    stack: Stack, fleet: SimFleet
) -> None:
    for r in fleet.replicas:
        await set_faults(r.url, reset_after_tokens=4)
    got: list[pb.ChatChunk] = []
    call = stack.stub.StreamChat(
        pb.ChatRequest(model=MODEL, messages=STORY, max_tokens=64, ignore_eos=True)
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for msg in call:
            got.append(msg)
    assert got, "the stream broke before its first message"
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stopped streaming" in (info.value.details() or "")
    assert in_flight(stack.gw) == ZERO
    assert "llm_gateway_streams_truncated_total{" in stack.gw.runtime.metrics.render().decode()


async def test_list_models(stack: Stack) -> None:
    resp = await stack.stub.ListModels(pb.ListModelsRequest())
    models = {m.id: m for m in resp.models}
    assert set(models) == {MODEL, LORA}
    assert not models[MODEL].HasField("parent") and models[MODEL].max_model_len == 8192
    assert models[LORA].parent == MODEL and models[MODEL].owned_by == "vllm"


async def test_health_follows_readiness(stack: Stack, fleet: SimFleet) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    serving = health_pb2.HealthCheckResponse.SERVING

    async def status(service: str = "") -> int:
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
        return int(resp.status)

    assert await status() == serving
    assert await status("llmgateway.v1.Inference") == serving
    for r in fleet.replicas:
        await set_faults(r.url, unhealthy=True)
    await until(lambda: _is(status(), health_pb2.HealthCheckResponse.NOT_SERVING), "NOT_SERVING")
    for r in fleet.replicas:
        await set_faults(r.url, unhealthy=False)
    await until(lambda: _is(status(), serving), "SERVING again")
    stack.gw.runtime.draining = True
    await until(lambda: _is(status("llmgateway.v1.Inference"), 2), "NOT_SERVING when draining")
    err = await _status(stack.stub.Complete(pb.CompletionRequest(model=MODEL, text="hi")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE


async def _is(value: Any, expected: int) -> bool:
    return bool(await value == expected)


async def test_reflection_lists_the_services(stack: Stack) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="llmgateway.v1.Inference"),
    ]
    responses = [r async for r in stub.ServerReflectionInfo(iter(requests))]
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"llmgateway.v1.Inference", "grpc.health.v1.Health"} <= names
    files = responses[1].file_descriptor_response.file_descriptor_proto
    assert files and b"llmgateway/v1/gateway.proto" in files[0]


async def test_api_keys_and_message_size_limit(fleet: SimFleet) -> None:
    cfg = gateway_config(fleet)
    cfg = replace(cfg, server=replace(cfg.server, api_keys=("sesame",)))
    grpc_cfg = GrpcConfig(enabled=True, port=0, max_receive_message_bytes=2048)
    async with (
        running_gateway(cfg) as gw,
        running_grpc(gw.runtime, grpc_cfg) as front,
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        stub = _stub(channel)
        req = pb.CompletionRequest(model=MODEL, text="hi", max_tokens=2)
        err = await _status(stub.Complete(req, metadata=(("authorization", "Bearer nope"),)))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        err = await _status(stub.ListModels(pb.ListModelsRequest()))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        auth = (("authorization", "Bearer sesame"),)
        assert (await stub.Complete(req, metadata=auth)).choices[0].text
        big = pb.CompletionRequest(model=MODEL, text="x" * 4096, max_tokens=2)
        err = await _status(stub.Complete(big, metadata=auth))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert in_flight(gw) == ZERO


async def test_stop_fails_health_then_cuts_open_streams_after_grace(
    fleet: SimFleet,
) -> None:
    async with running_gateway(gateway_config(fleet)) as gw:
        front = GrpcFrontEnd(gw.runtime, GrpcConfig(enabled=True, port=0))
        port = await front.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = _stub(channel).StreamChat(
                pb.ChatRequest(model=MODEL, messages=STORY, max_tokens=4000, ignore_eos=True)
            )
            await call.read()
            started = time.monotonic()
            await front.stop(grace_s=0.2)
            assert time.monotonic() - started < 2.0
            with pytest.raises(grpc.aio.AioRpcError):
                while True:
                    if await call.read() is grpc.aio.EOF:
                        break
            await until(lambda: running(fleet) == 0, "the replica to abort the request")
            assert in_flight(gw) == ZERO
