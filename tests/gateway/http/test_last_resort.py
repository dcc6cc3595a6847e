"""A bug anywhere before the response starts is vLLM's JSON 500 (gRPC: INTERNAL), counted."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

import grpc
import httpx
import pytest

from gateway.config import ServerConfig
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.service import InferenceService
from gateway.http.app import GatewayApp
from routing.router import Router
from simulator import SimFleet
from tests.gateway.conftest import MODEL, InProcessGateway, gateway_config, in_flight, in_process
from tests.gateway.http.errors import requests_total, vllm_error

COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
SECRET = "secret-internal-detail"
ZERO = {"sim-0": 0, "sim-1": 0}


def _boom(*_args: object, **_kwargs: object) -> NoReturn:
    raise RuntimeError(SECRET)


def _internal(r: httpx.Response) -> None:
    error = vllm_error(r, 500)
    assert error["type"] == "InternalServerError"
    assert SECRET not in r.text and "RuntimeError" not in r.text


def _logged_with_traceback(caplog: pytest.LogCaptureFixture) -> bool:
    return any(
        rec.exc_info is not None and SECRET in str(rec.exc_info[1]) for rec in caplog.records
    )


async def test_a_bug_while_parsing_is_a_json_500_counted_and_logged(
    asgi_gateway: InProcessGateway,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("gateway.http.app.parse_request", _boom)
    with caplog.at_level(logging.ERROR, logger="llm_gateway.http"):
        _internal(await asgi_gateway.client.post("/v1/completions", json=COMPLETION))
    assert _logged_with_traceback(caplog)
    assert requests_total(asgi_gateway.runtime, status="500", model="_unknown") == 1


async def test_a_bug_while_routing_is_a_json_500_counted_and_logged(
    asgi_gateway: InProcessGateway,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(Router, "route", _boom)
    with caplog.at_level(logging.ERROR, logger="llm_gateway.http"):
        _internal(await asgi_gateway.client.post("/v1/completions", json=COMPLETION))
    assert _logged_with_traceback(caplog)
    assert requests_total(asgi_gateway.runtime, status="500", model=MODEL) == 1
    assert in_flight(asgi_gateway) == ZERO


@pytest.mark.parametrize("stream", [False, True])
async def test_a_bug_before_the_response_starts_is_a_json_500(
    asgi_gateway: InProcessGateway,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stream: bool,
) -> None:
    monkeypatch.setattr("gateway.http.app.client_response_headers", _boom)
    body = {**COMPLETION, "stream": stream}
    with caplog.at_level(logging.ERROR, logger="llm_gateway.http"):
        _internal(await asgi_gateway.client.post("/v1/completions", json=body))
    assert _logged_with_traceback(caplog)
    # Counted once, as what the client got; the replica's lease is back and it is not blamed.
    assert requests_total(asgi_gateway.runtime) == 1
    assert requests_total(asgi_gateway.runtime, status="500") == 1
    assert in_flight(asgi_gateway) == ZERO
    assert all(rep.errors_total == 0 for rep in asgi_gateway.runtime.pool)


async def test_cancellation_is_not_swallowed(
    asgi_gateway: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cancelled(*_args: object) -> NoReturn:
        raise asyncio.CancelledError

    monkeypatch.setattr("gateway.http.app.parse_request", cancelled)
    app = GatewayApp(asgi_gateway.runtime)
    sent: list[object] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: object) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    with pytest.raises(asyncio.CancelledError):
        await app(scope, receive, send)
    assert sent == []


async def test_refusals_before_routing_are_counted(fleet: SimFleet) -> None:
    cfg = gateway_config(fleet, server=ServerConfig(port=0, api_keys=("k1",), max_body_bytes=1000))
    async with in_process(cfg) as gw:
        c, auth = gw.client, {"authorization": "Bearer k1"}
        vllm_error(await c.post("/v1/completions", json=COMPLETION), 401)
        vllm_error(await c.post("/v1/completions", content=b"{", headers=auth), 400)
        vllm_error(await c.post("/v1/completions", content=b" " * 2000, headers=auth), 413)
        for status in ("401", "400", "413"):
            assert requests_total(gw.runtime, status=status, model="_unknown") == 1, status


async def test_a_bug_in_a_starlette_route_is_a_json_500(
    asgi_gateway: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.http.app.apply_heartbeat", _boom)
    # Starlette re-raises after answering (for the server's log): see the answer, not that.
    transport = httpx.ASGITransport(
        app=GatewayApp(asgi_gateway.runtime), raise_app_exceptions=False
    )
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        _internal(await c.post("/admin/heartbeat", json={"replica": "sim-0"}))


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """The servicer context's calls the service makes before any response is sent."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", "grpc-bug-1"),)

    def time_remaining(self) -> float | None:
        return None

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing: object = ()
    ) -> NoReturn:
        raise _Aborted(code, details)

    async def send_initial_metadata(self, _metadata: object) -> None:
        raise AssertionError("no response may start")

    async def write(self, _message: object) -> None:
        raise AssertionError("no response may start")


@pytest.mark.parametrize(
    ("target", "model"),
    [("gateway.grpc.service.parse_request", "_unknown"), ("routing.router.Router.route", MODEL)],
)
async def test_grpc_maps_a_bug_to_internal_and_counts_it(
    asgi_gateway: InProcessGateway,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    target: str,
    model: str,
) -> None:
    monkeypatch.setattr(target, _boom)
    service = InferenceService(asgi_gateway.runtime)
    request = pb.CompletionRequest(model=MODEL, text="Once upon a time", max_tokens=4)
    with caplog.at_level(logging.ERROR, logger="llm_gateway.grpc"), pytest.raises(_Aborted) as info:
        await service.Complete(request, _Context())
    assert info.value.code == grpc.StatusCode.INTERNAL and SECRET not in info.value.details
    assert _logged_with_traceback(caplog)
    assert requests_total(asgi_gateway.runtime) == 1
    assert requests_total(asgi_gateway.runtime, status="500", model=model) == 1
    assert in_flight(asgi_gateway) == ZERO
