"""The audio routes through the gateway, over sockets: multipart bodies within the body
limit, refused with a 400 when they cannot be routed, relayed to the replica otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest

from gateway.config import ServerConfig
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, gateway_config

LIMIT = 64 * 1024


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    fleet = SimFleet(SIM, replicas=1, host="127.0.0.1", base_port=0)
    async with fleet:
        cfg = gateway_config(fleet)
        # Audio has its own limit, larger here than the JSON routes' one.
        server = ServerConfig(port=0, max_body_bytes=LIMIT // 4, max_audio_body_bytes=LIMIT)
        cfg = replace(cfg, server=server)
        async with running_gateway(cfg) as running:
            yield running


def _wav(size: int) -> tuple[str, bytes, str]:
    return ("a.wav", b"RIFF" + bytes(size), "audio/wav")


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
async def test_an_upload_over_the_body_limit_is_refused_with_413(
    gw: RunningGateway, path: str
) -> None:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        r = await c.post(path, files={"file": _wav(LIMIT)}, data={"model": MODEL})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == 413
        # Over the JSON routes' limit, within audio's: past the limit check (a generative
        # replica then answers vLLM's 404 for a route it does not serve).
        r = await c.post(path, files={"file": _wav(LIMIT // 2)}, data={"model": MODEL})
        assert r.status_code != 413, r.text
        big = {"model": MODEL, "prompt": "x" * (LIMIT // 2), "max_tokens": 1}
        r = await c.post("/v1/completions", json=big)
        assert r.status_code == 413, r.text


async def test_malformed_multipart_and_missing_parts_are_400s(gw: RunningGateway) -> None:
    path = "/v1/audio/transcriptions"
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        ct = {"content-type": "multipart/form-data; boundary=xyz"}
        r = await c.post(path, content=b"--xyz\r\nnot a header block", headers=ct)
        assert r.status_code == 400, r.text
        assert "Invalid multipart/form-data body" in r.json()["error"]["message"]
        r = await c.post(path, files={"file": _wav(10)})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "model")
        r = await c.post(path, files={"other": _wav(10)}, data={"model": MODEL})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "file")


async def test_a_model_without_the_task_answers_as_vllm_does(gw: RunningGateway) -> None:
    # A generative replica has no audio route (vLLM attaches it by the model's task).
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        r = await c.post(
            "/v1/audio/transcriptions", files={"file": _wav(100)}, data={"model": MODEL}
        )
    assert r.status_code == 404, r.text
    assert "error" in r.json()
