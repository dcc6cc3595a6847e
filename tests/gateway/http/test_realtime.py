"""/v1/realtime through the gateway, over sockets: a transcription replica (the simulator's
vLLM realtime protocol) and a generative one, clients speaking WebSocket to the gateway."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import websockets
from openai import AsyncOpenAI
from websockets.asyncio.client import ClientConnection, connect

from gateway.config import (
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    ServerConfig,
    UpstreamConfig,
)
from gateway.http import protocol
from gateway.process import RunningGateway, running_gateway
from simulator import SimConfig, SimFleet
from simulator.realtime import open_sessions
from tests.gateway.conftest import MODEL, SIM, eventually

KEY = "rt-key"
RT_MODEL = "sim-voxtral"
RT = SimConfig(model=RT_MODEL, runner="transcription", time_scale=50.0, kv_events=False, seed=3)
AUTH = {"Authorization": f"Bearer {KEY}"}
# 0.5 s of 16 kHz PCM16: six tokens at the simulated model's 80 ms per token.
AUDIO = base64.b64encode(bytes(range(256)) * 62 + bytes(128)).decode()


@dataclass
class GatewayView:
    """What the realtime tests read off a running gateway."""

    gw: RunningGateway

    @property
    def url(self) -> str:
        return self.gw.url.replace("http://", "ws://") + "/v1/realtime"

    def in_flight(self) -> dict[str, int]:
        return {r.name: r.in_flight for r in self.gw.runtime.pool}

    def outcomes(self) -> dict[tuple[str, str], float]:
        rows = self.gw.runtime.metrics.samples(["llm_gateway_realtime_sessions"])
        return {
            (s.labels["model"], s.labels["outcome"]): s.value
            for s in rows.get("llm_gateway_realtime_sessions", [])
        }


@dataclass
class Rig(GatewayView):
    rt: SimFleet
    gen: SimFleet


@asynccontextmanager
async def rig(**server: Any) -> AsyncIterator[Rig]:
    async with (
        SimFleet(RT, replicas=1, host="127.0.0.1", base_port=0) as rt,
        SimFleet(SIM, replicas=1, host="127.0.0.1", base_port=0) as gen,
    ):
        cfg = GatewayConfig(
            server=ServerConfig(port=0, api_keys=(KEY,), **server),
            upstream=UpstreamConfig(connect_timeout_s=1.0),
            health_check=HealthCheckConfig(interval_s=0.1, timeout_s=0.5),
            replicas=(
                ReplicaConfig(url=rt.replicas[0].url, name="rt-0"),
                ReplicaConfig(url=gen.replicas[0].url, name="gen-0"),
            ),
        )
        async with running_gateway(cfg) as gw:
            yield Rig(gw, rt, gen)


@pytest.fixture
async def r() -> AsyncIterator[Rig]:
    async with rig() as running:
        yield running


async def recv(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await ws.recv())
    return event


async def transcribe(ws: ClientConnection) -> tuple[list[str], dict[str, Any]]:
    """One utterance after session.update: its deltas and its transcription.done."""
    for event in (
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.append", "audio": AUDIO},
        {"type": "input_audio_buffer.commit", "final": True},
    ):
        await ws.send(json.dumps(event))
    deltas: list[str] = []
    while (event := await recv(ws))["type"] == "transcription.delta":
        deltas.append(event["delta"])
    return deltas, event


async def close_code(ws: ClientConnection) -> int:
    """The code the gateway closed `ws` with (1006: no close frame)."""
    try:
        while True:
            await ws.recv()
    except websockets.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else 1006


async def refused(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with connect(url, **kwargs):
            pass
    response = caught.value.response
    return response.status_code, json.loads(bytes(response.body or b"{}"))


async def test_a_session_named_in_band_gets_vllms_events(r: Rig) -> None:
    async with connect(r.url, additional_headers=AUTH) as ws:
        created = await recv(ws)
        assert created["type"] == "session.created" and created["id"].startswith("sess-")
        await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        deltas, done = await transcribe(ws)
        assert len(deltas) == 6
        assert done["type"] == "transcription.done"
        assert done["text"] == "".join(deltas)
        usage = done["usage"]
        assert usage["completion_tokens"] == 6
        assert usage["total_tokens"] == usage["prompt_tokens"] + 6
        # Open: counted in flight on its replica, so routing sees the load.
        assert r.in_flight() == {"rt-0": 1, "gen-0": 0}
        # A second utterance on the same session.
        again, _ = await transcribe(ws)
        assert again == deltas  # the same audio transcribes the same way
    await eventually(lambda: r.in_flight() == {"rt-0": 0, "gen-0": 0}, what="lease released")
    await eventually(lambda: open_sessions(r.rt.replicas[0]) == 0, what="replica socket closed")
    assert r.outcomes()[(RT_MODEL, "client_closed")] == 1


async def test_frames_sent_before_the_session_update_reach_the_replica_in_order(r: Rig) -> None:
    async with connect(r.url, additional_headers=AUTH) as ws:
        assert (await recv(ws))["type"] == "session.created"
        # vLLM answers a commit before session.update with an error: the replica does so.
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        error = await recv(ws)
        assert error == {
            "type": "error",
            "error": "Model not validated. Make sure to validate the model by sending a "
            "session.update event.",
            "code": "model_not_validated",
        }
        deltas, done = await transcribe(ws)
        assert deltas and done["text"] == "".join(deltas)


async def test_the_openai_sdk_connects_with_the_model_in_the_url(r: Rig) -> None:
    client = AsyncOpenAI(base_url=r.gw.url + "/v1", api_key=KEY)
    async with client.realtime.connect(model=RT_MODEL) as conn:
        # Routed before the upgrade: the replica's own session.created comes through.
        created = json.loads(await conn.recv_bytes())
        assert created["type"] == "session.created"
        await conn.send_raw(json.dumps({"type": "session.update", "model": RT_MODEL}))
        for event in (
            {"type": "input_audio_buffer.commit"},
            {"type": "input_audio_buffer.append", "audio": AUDIO},
            {"type": "input_audio_buffer.commit", "final": True},
        ):
            await conn.send_raw(json.dumps(event))
        kinds = []
        while (event := json.loads(await conn.recv_bytes()))["type"] != "transcription.done":
            kinds.append(event["type"])
        assert kinds == ["transcription.delta"] * 6
        assert event["usage"]["completion_tokens"] == 6
    await eventually(lambda: r.in_flight()["rt-0"] == 0, what="lease released")


async def test_an_upgrade_without_a_valid_key_is_refused_before_it(r: Rig) -> None:
    status, body = await refused(r.url)
    assert (status, body["error"]["code"]) == (401, 401)
    bad = {"Authorization": "Bearer nope"}
    assert (await refused(r.url + f"?model={RT_MODEL}", additional_headers=bad))[0] == 401
    # A browser cannot set headers: the key rides in OpenAI's subprotocol, never chosen back.
    offered = ["realtime", f"openai-insecure-api-key.{KEY}"]
    async with connect(r.url, subprotocols=offered) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "realtime"
        assert (await recv(ws))["type"] == "session.created"
    outcomes = r.outcomes()
    assert outcomes[("_unknown", "unauthorized")] == outcomes[(RT_MODEL, "unauthorized")] == 1
    assert r.in_flight() == {"rt-0": 0, "gen-0": 0}


async def test_an_unknown_model_is_a_404_or_vllms_error_event(r: Rig) -> None:
    status, body = await refused(r.url + "?model=nope", additional_headers=AUTH)
    assert status == 404
    assert body["error"]["message"] == "The model `nope` does not exist."
    async with connect(r.url, additional_headers=AUTH) as ws:
        await recv(ws)
        await ws.send(json.dumps({"type": "session.update", "model": "nope"}))
        assert await recv(ws) == {
            "type": "error",
            "error": "The model `nope` does not exist.",
            "code": "model_not_found",
        }
        # The connection stays open, as on vLLM: a served model still starts the session.
        await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        deltas, _ = await transcribe(ws)
        assert len(deltas) == 6


async def test_a_replica_without_the_realtime_route_is_a_clear_error(r: Rig) -> None:
    # The generative replica serves MODEL but no /v1/realtime (vLLM answers the upgrade 403).
    status, body = await refused(r.url + f"?model={MODEL}", additional_headers=AUTH)
    assert status == 502
    assert "has no /v1/realtime" in body["error"]["message"]
    async with connect(r.url, additional_headers=AUTH) as ws:
        await recv(ws)
        await ws.send(json.dumps({"type": "session.update", "model": MODEL}))
        assert await close_code(ws) == 1014
    assert r.outcomes()[(MODEL, "upstream_refused")] == 2
    assert r.in_flight() == {"rt-0": 0, "gen-0": 0}


async def test_no_healthy_replica_is_a_503_or_try_again_later(r: Rig) -> None:
    await r.rt.replicas[0].stop()
    pool = r.gw.runtime.pool
    await eventually(lambda: not pool["rt-0"].healthy, what="replica marked down")
    assert (await refused(r.url + f"?model={RT_MODEL}", additional_headers=AUTH))[0] == 503
    async with connect(r.url, additional_headers=AUTH) as ws:
        await recv(ws)
        await ws.send(json.dumps({"type": "session.update", "model": RT_MODEL}))
        assert await close_code(ws) == 1013


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_the_client_leaving_closes_the_replicas_socket(r: Rig, how: str) -> None:
    replica = r.rt.replicas[0]
    ws = await connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH)
    await recv(ws)
    await eventually(lambda: open_sessions(replica) == 1, what="replica socket open")
    if how == "close":
        await ws.close(code=4000, reason="done here")
    else:
        ws.transport.abort()  # gone without a close frame
    await eventually(lambda: open_sessions(replica) == 0, what="replica socket closed")
    await eventually(lambda: r.in_flight()["rt-0"] == 0, what="lease released")
    assert r.outcomes()[(RT_MODEL, "client_closed")] == 1


async def test_the_replica_dying_closes_the_client_with_an_error_code(r: Rig) -> None:
    async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
        await recv(ws)
        # vLLM reads text frames only: a binary one ends its handler without a close frame.
        await ws.send(b"\x00\x01")
        assert await close_code(ws) == 1014
    await eventually(lambda: r.in_flight()["rt-0"] == 0, what="lease released")
    assert r.outcomes()[(RT_MODEL, "upstream_error")] == 1


async def test_a_replica_shutting_down_passes_its_close_code(r: Rig) -> None:
    async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
        await recv(ws)
        await r.rt.replicas[0].stop()
        assert await close_code(ws) == 1012  # uvicorn's "service restart", as vLLM sends it
    await eventually(lambda: r.in_flight()["rt-0"] == 0, what="lease released")


async def test_idle_sessions_and_oversized_messages_are_closed() -> None:
    async with rig(realtime_idle_timeout_s=0.3, realtime_max_message_bytes=4096) as r:
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            assert await close_code(ws) == 1001
        async with connect(r.url, additional_headers=AUTH) as ws:
            await recv(ws)  # silent before session.update: closed the same way
            assert await close_code(ws) == 1001
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            await ws.send("x" * 5000)
            assert await close_code(ws) == 1009
        await eventually(lambda: open_sessions(r.rt.replicas[0]) == 0, what="sockets closed")
        assert r.in_flight()["rt-0"] == 0
        outcomes = r.outcomes()
        assert outcomes[(RT_MODEL, "idle_timeout")] == 1
        assert outcomes[("_unknown", "idle_timeout")] == 1
        assert outcomes[(RT_MODEL, "message_too_big")] == 1


async def test_sessions_past_the_cap_are_refused_with_503() -> None:
    async with rig(realtime_max_sessions=1) as r:
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            assert (await refused(r.url, additional_headers=AUTH))[0] == 503
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            assert (await recv(ws))["type"] == "session.created"


async def test_an_upgrade_elsewhere_is_refused_as_vllm_does(r: Rig) -> None:
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with connect(r.gw.url.replace("http://", "ws://") + "/v1/chat/completions"):
            pass
    assert caught.value.response.status_code == 403


async def test_a_session_holds_its_clients_connection_slot_until_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Loopback is never capped; here every client is on it, so it counts like any address.
    monkeypatch.setattr(protocol, "LOOPBACK", ())
    async with rig(max_connections_per_client=1) as r:
        per_client = r.gw.server.config.http_protocol_class.per_client
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            await recv(ws)
            assert per_client == {"127.0.0.1": 1}  # the upgraded connection still counts
            with pytest.raises(websockets.InvalidStatus) as caught:
                async with connect(r.url, additional_headers=AUTH):
                    pass
            assert caught.value.response.status_code == 503
        await eventually(lambda: not per_client, what="the slot freed")
        async with connect(r.url + f"?model={RT_MODEL}", additional_headers=AUTH) as ws:
            assert (await recv(ws))["type"] == "session.created"
