"""/v1/realtime on a replica without the realtime task, as vLLM 0.32 answers it.

vLLM registers its realtime WebSocket route only for a model with the "realtime" task
(speech_to_text/factories.py). Without it no route takes the socket: Starlette closes it
before accepting and uvicorn turns that into a bare 403 to the upgrade; a plain request to
the path gets Starlette's 404. The gateway reads that 403 as "no /v1/realtime here".
"""

from __future__ import annotations

import httpx
import pytest
import websockets
from websockets.asyncio.client import connect

from tests.conformance.helpers import Target


async def test_a_websocket_upgrade_without_the_realtime_task_is_a_bare_403(
    target: Target,
) -> None:
    url = target.base_url.replace("http://", "ws://") + "/v1/realtime"
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with connect(url, open_timeout=30):
            pass
    response = caught.value.response
    assert response.status_code == 403
    assert not response.body
    assert response.headers.get("Content-Length") == "0"
    assert response.headers.get("Content-Type") == "text/plain; charset=utf-8"


async def test_a_plain_request_to_the_realtime_path_is_a_404(
    client: httpx.AsyncClient,
) -> None:
    for method in ("GET", "POST"):
        r = await client.request(method, "/v1/realtime")
        assert r.status_code == 404, r.text
        assert r.json() == {"detail": "Not Found"}
