"""A served request leaves no reference cycle: reference counting frees it, not the collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.transport import DisconnectHook
from tests.gateway.conftest import MODEL

REQUESTS = 40


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """What the collector finds unreachable while the test runs, kept for inspection."""
    flags = gc.get_debug()
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


async def test_requests_leave_no_cycles_of_the_front_end(
    client: httpx.AsyncClient, saved_garbage: list[object]
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    await client.post("/v1/chat/completions", json=body)  # the keep-alive connection is open
    gc.collect()
    saved_garbage.clear()
    for i in range(REQUESTS):
        r = await client.post("/v1/chat/completions", json={**body, "stream": i % 2 == 1})
        assert r.status_code == 200, r.text
    gc.collect()
    # Per request, a cycle through the scope's disconnect hook kept its whole uvicorn cycle
    # (scope, headers, events: ~11 objects) for the young collections to find.
    ours = [o for o in saved_garbage if isinstance(o, (DisconnectHook, RequestResponseCycle))]
    assert len(ours) <= 2, f"{len(ours)} front-end objects in cycles after {REQUESTS} requests"
