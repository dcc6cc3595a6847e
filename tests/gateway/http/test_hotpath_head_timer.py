"""The head deadline: one timer per connection, re-armed when it fires, never per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import ServerConfig
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.conftest import gateway_config
from tests.gateway.http.raw import connect
from tests.gateway.http.test_limits import _head, _read_to_eof, _refusal, _response

HEADER_TIMEOUT_S = 0.5


def _server() -> ServerConfig:
    return ServerConfig(port=0, header_timeout_s=HEADER_TIMEOUT_S)


async def test_kept_alive_requests_arm_no_head_timer_each(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    armed: list[str] = []
    call_later: Callable[..., asyncio.TimerHandle] = loop.call_later

    def counting(delay: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        name = getattr(callback, "__name__", "")
        if name.startswith("_head"):
            armed.append(name)
        return call_later(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", counting)
    cfg = gateway_config(fleet, server=_server())
    async with running_gateway(cfg) as gw, connect(gw) as (reader, writer):
        for _ in range(20):
            writer.write(_head())
            assert (await _response(reader))[0] == 200
    # The connection's own timer, set when it opened (still pending: the heads came in time).
    assert len(armed) == 1, armed


async def test_a_later_head_gets_its_whole_deadline_from_a_timer_set_for_an_earlier_one(
    fleet: SimFleet,
) -> None:
    cfg = gateway_config(fleet, server=_server())
    async with running_gateway(cfg) as gw, connect(gw) as (reader, writer):
        writer.write(_head())
        assert (await _response(reader))[0] == 200
        # The connection's timer fires HEADER_TIMEOUT_S after it opened: a head begun later
        # must not be cut then, but HEADER_TIMEOUT_S after it began.
        await asyncio.sleep(HEADER_TIMEOUT_S * 0.6)  # pacing the client
        begun = time.monotonic()
        writer.write(b"GET /v1/mo")
        _refusal(await _read_to_eof(reader), 408, "RequestTimeoutError")
        waited = time.monotonic() - begun
        assert HEADER_TIMEOUT_S * 0.95 <= waited < HEADER_TIMEOUT_S + 2.0, waited
