"""The simulator's /v1/realtime for a transcription model: vLLM 0.32's events and errors
(vllm/entrypoints/speech_to_text/realtime/connection.py), over a real socket."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from simulator import SimConfig, SimFleet

MODEL = "sim-voxtral"
CONFIG = SimConfig(model=MODEL, runner="transcription", time_scale=50.0, kv_events=False)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with SimFleet(CONFIG, replicas=1, host="127.0.0.1", base_port=0) as fleet:
        yield fleet.replicas[0].url


async def recv(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await ws.recv())
    return event


def error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "error": message, "code": code}


async def test_bad_events_get_vllms_error_events_and_the_session_goes_on(url: str) -> None:
    async with connect(url.replace("http://", "ws://") + "/v1/realtime") as ws:
        assert (await recv(ws))["type"] == "session.created"
        cases: list[tuple[str, dict[str, Any]]] = [
            ("{not json", error("Invalid JSON", "invalid_json")),
            (json.dumps({"type": "nope"}), error("Unknown event type: nope", "unknown_event")),
            (
                json.dumps({"type": "session.update"}),
                error("Missing required field: model", "invalid_event"),
            ),
            (
                json.dumps({"type": "session.update", "model": "other"}),
                error("The model `other` does not exist.", "model_not_found"),
            ),
            (
                json.dumps({"type": "input_audio_buffer.append", "audio": "AAA"}),
                error("Invalid audio data", "invalid_audio"),
            ),
        ]
        for sent, answer in cases:
            await ws.send(sent)
            assert await recv(ws) == answer
        # Still open: a served model starts a transcription, ended by a final commit.
        audio = base64.b64encode(bytes(2560)).decode()  # 80 ms: one token
        for event in (
            {"type": "session.update", "model": MODEL},
            {"type": "input_audio_buffer.append", "audio": audio},
            {"type": "input_audio_buffer.commit"},
            {"type": "input_audio_buffer.commit", "final": True},
        ):
            await ws.send(json.dumps(event))
        delta = await recv(ws)
        done = await recv(ws)
        assert delta["type"] == "transcription.delta"
        assert done["type"] == "transcription.done" and done["text"] == delta["delta"]
        assert done["usage"] == {
            "prompt_tokens": 1,
            "total_tokens": 2,
            "completion_tokens": 1,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }


async def test_a_plain_request_to_the_path_is_a_404(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.get("/v1/realtime")
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
