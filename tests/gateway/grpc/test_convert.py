"""Proto <-> OpenAI JSON, metadata hints, status mapping and server options, without sockets."""

from __future__ import annotations

import grpc
import orjson
import pytest

from gateway.errors import BadRequest, ModelNotFound, NoHealthyReplica, UpstreamFailed
from gateway.grpc.config import GrpcConfig
from gateway.grpc.convert import (
    model_list,
    read_hints,
    request_body,
    request_id,
    to_proto,
)
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.status import (
    TRUNCATED,
    from_gateway_error,
    from_stream_error,
    from_upstream,
)
from gateway.proxy.hints import apply as apply_hints
from gateway.proxy.requests import parse_request


def test_completion_request_body_has_only_the_fields_set() -> None:
    req = pb.CompletionRequest(model="m", text="hi")
    assert orjson.loads(request_body("completions", req, stream=False)) == {
        "model": "m",
        "prompt": "hi",
    }
    full = pb.CompletionRequest(
        model="lora-a",
        token_ids=pb.TokenIds(ids=[1, 2, 3]),
        max_tokens=5,
        temperature=0.7,
        top_p=0.9,
        stop=["\n", "END"],
        seed=-3,
        user="u",
        priority=0,
        ignore_eos=False,
        include_usage=True,
    )
    assert orjson.loads(request_body("completions", full, stream=True)) == {
        "model": "lora-a",
        "prompt": [1, 2, 3],
        "max_tokens": 5,
        "temperature": 0.7,  # not 0.699999988079071: the proto field is a 32-bit float
        "top_p": 0.9,
        "stop": ["\n", "END"],
        "seed": -3,
        "user": "u",
        "priority": 0,
        "ignore_eos": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_chat_request_body_and_the_same_validation_as_http() -> None:
    req = pb.ChatRequest(model="m", messages=[pb.ChatMessage(role="user", content="hey")])
    body = request_body("chat", req, stream=False)
    assert orjson.loads(body) == {"model": "m", "messages": [{"role": "user", "content": "hey"}]}
    assert parse_request("chat", body, "r1").features.prompt_tokens == 0
    # include_usage means nothing without a stream (vLLM would refuse stream_options).
    req.include_usage = True
    assert "stream_options" not in orjson.loads(request_body("chat", req, stream=False))
    with pytest.raises(BadRequest, match="messages"):
        parse_request("chat", request_body("chat", pb.ChatRequest(model="m"), False), "r")
    with pytest.raises(BadRequest, match="prompt"):
        parse_request(
            "completions", request_body("completions", pb.CompletionRequest(model="m"), False), "r"
        )


def test_hints_from_metadata() -> None:
    meta: list[tuple[str, str | bytes]] = [
        ("x-request-id", "abc-1"),
        ("x-session-id", "s1"),
        ("x-tenant-id", "acme"),
        ("x-priority", "-5"),
        ("user-agent", "grpc-python/1.0"),
        ("authorization", "Bearer secret"),
        ("grpc-accept-encoding", "gzip"),
        ("trace-bin", b"\x00\x01"),
    ]
    hints = read_hints(meta)
    assert request_id(meta) == "abc-1"
    assert (hints.tenant, hints.priority) == ("acme", -5)
    assert hints.headers == (
        (b"x-request-id", b"abc-1"),
        (b"x-session-id", b"s1"),
        (b"x-tenant-id", b"acme"),
        (b"x-priority", b"-5"),
    )
    fresh = request_id([("x-request-id", "has space")])
    assert fresh != "has space" and len(fresh) == 32
    assert request_id([("x-rid", "mine")], key="x-rid") == "mine"
    with pytest.raises(BadRequest, match="x-priority"):
        read_hints([("x-priority", "urgent")])

    parsed = parse_request("completions", b'{"model": "m", "prompt": "p"}', "r")
    routed = apply_hints(parsed, hints)
    assert (routed.features.tenant, routed.features.priority) == ("acme", -5)
    assert routed.body == parsed.body  # hints steer routing, never the upstream body
    explicit = parse_request("completions", b'{"model":"m","prompt":"p","priority":3}', "r")
    assert apply_hints(explicit, hints).features.priority == 3


def test_responses_to_proto() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    choice = {"index": 0, "text": "ab", "finish_reason": "stop", "stop_reason": 128001}
    msg = to_proto(
        "completion", {"id": "c1", "model": "m", "created": 5, "choices": [choice], "usage": usage}
    )
    assert msg.choices[0].text == "ab" and msg.choices[0].stop_reason == "128001"
    assert msg.usage.cached_tokens == 8 and msg.created == 5
    chat = to_proto(
        "chat",
        {
            "choices": [
                {"message": {"role": "assistant", "content": None}, "finish_reason": "length"}
            ],
            "usage": {**usage, "prompt_tokens_details": None},
        },
    )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content == ""
    assert not chat.usage.HasField("cached_tokens")
    chunk = to_proto(
        "chat_chunk", {"choices": [{"delta": {"content": "x"}, "finish_reason": None}]}
    )
    assert chunk.choices[0].delta.content == "x"
    assert not chunk.choices[0].HasField("finish_reason") and not chunk.HasField("usage")
    cards = [
        {"id": "base", "owned_by": "vllm", "created": 1, "parent": None, "max_model_len": 4096},
        {"id": "lora", "owned_by": "vllm", "created": 1, "parent": "base", "max_model_len": None},
    ]
    models = model_list(cards).models
    assert [(m.id, m.HasField("parent"), m.HasField("max_model_len")) for m in models] == [
        ("base", False, True),
        ("lora", True, False),
    ]


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (BadRequest("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (ModelNotFound("m"), grpc.StatusCode.NOT_FOUND),
        (NoHealthyReplica("none"), grpc.StatusCode.UNAVAILABLE),
        (UpstreamFailed("failed"), grpc.StatusCode.UNAVAILABLE),
        (UpstreamFailed("slow", status=504), grpc.StatusCode.DEADLINE_EXCEEDED),
        (UpstreamFailed("rate", status=429, retry_after_s=2.5), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (UpstreamFailed("odd", status=500), grpc.StatusCode.INTERNAL),
    ],
)
def test_gateway_errors_map_to_codes(err: Exception, code: grpc.StatusCode) -> None:
    failure = from_gateway_error(err)  # type: ignore[arg-type]
    assert failure.code == code
    trailers = dict(failure.trailing_metadata("rid"))
    assert trailers["x-request-id"] == "rid"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert trailers["retry-delay"] == "2.5s"
    elif code in (grpc.StatusCode.UNAVAILABLE,):
        assert trailers["retry-delay"] == "1s"
    else:
        assert "retry-delay" not in trailers


def test_upstream_answers_map_without_leaking() -> None:
    vllm_400 = (
        b'{"error":{"message":"max_tokens is too large","type":"BadRequestError","code":400}}'
    )
    f = from_upstream(400, vllm_400, {})
    assert (f.code, f.message) == (grpc.StatusCode.INVALID_ARGUMENT, "max_tokens is too large")
    old = from_upstream(404, b'{"object":"error","message":"no such model"}', {})
    assert (old.code, old.message) == (grpc.StatusCode.NOT_FOUND, "no such model")
    limited = from_upstream(429, b"not json", {"Retry-After": "3"})
    assert limited.code == grpc.StatusCode.RESOURCE_EXHAUSTED and limited.retry_after_s == 3.0
    # The gateway's own upstream credentials were refused: nothing the client can act on.
    auth = from_upstream(401, b'{"error":{"message":"key for http://10.0.0.7:8000"}}', {})
    assert auth.code == grpc.StatusCode.INTERNAL and "10.0.0.7" not in auth.message
    assert len(from_upstream(400, orjson.dumps({"message": "x" * 5000}), {}).message) == 1024


def test_stream_errors_end_the_call() -> None:
    engine = from_stream_error({"error": {"message": "CUDA error at 10.1.2.3", "code": 500}})
    assert engine.code == grpc.StatusCode.INTERNAL and engine.message == TRUNCATED
    assert engine.replica_fault
    bad = from_stream_error({"error": {"message": "bad stop", "code": 400}})
    assert (bad.code, bad.message, bad.replica_fault) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "bad stop",
        False,
    )


def test_config_becomes_server_options() -> None:
    cfg = GrpcConfig(
        max_receive_message_bytes=1000,
        keepalive_time_s=30.0,
        keepalive_timeout_s=5.5,
        keepalive_permit_without_calls=True,
    )
    opts = dict(cfg.server_options())
    assert opts["grpc.max_receive_message_length"] == 1000
    assert opts["grpc.keepalive_time_ms"] == 30_000
    assert opts["grpc.keepalive_timeout_ms"] == 5_500
    assert opts["grpc.keepalive_permit_without_calls"] == 1
    assert opts["grpc.so_reuseport"] == 0
    assert GrpcConfig(host="::1", port=7).address == "[::1]:7"
    assert not GrpcConfig().enabled and GrpcConfig().port == 50051
    for bad in ({"port": 70000}, {"keepalive_time_s": 0}, {"max_concurrent_rpcs": -1}):
        with pytest.raises(ValueError):
            GrpcConfig(**bad)  # type: ignore[arg-type]
