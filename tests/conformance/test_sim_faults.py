"""The simulator's fault modes, as a client sees them (simulator only: admin routes).

Every fault is switched through ``POST /_sim/faults`` on a fresh replica; what the client
sees must be what it would see from a failing vLLM: its error body, a reset connection, a
stream cut without ``data: [DONE]``, silence, or /health 503.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import running_sim, sim_config
from tests.conformance.helpers import (
    KvSubscriber,
    Prompts,
    SseStream,
    Target,
    cached_tokens,
    complete,
    parse_sse,
    prompt_of,
    wait_for,
)
from vllm_api.kv_events import AllBlocksCleared

FAULT_FIELDS = {
    "error_rate": 0.0,
    "error_status": 500,
    "reset_before_first_byte": False,
    "reset_after_tokens": None,
    "stall_seconds": 0.0,
    "stall_after_tokens": None,
    "unhealthy": False,
    "slow_start_seconds": 0.0,
    "dead": False,
    "out_of_kv": False,
    "load_untracked": False,
    "load_absent": False,
}


@pytest.fixture
async def sim(sim_target: tuple[Target, Any]) -> AsyncIterator[tuple[Target, httpx.AsyncClient]]:
    tgt, _ = sim_target
    async with httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as c:
        yield tgt, c


@pytest.fixture
def prompts(request: pytest.FixtureRequest) -> Prompts:
    return Prompts(seed=request.node.nodeid)


async def _set(client: httpx.AsyncClient, **faults: Any) -> dict[str, Any]:
    resp = await client.post("/_sim/faults", json=faults)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _gen_body(tgt: Target, prompts: Prompts, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": tgt.model,
        "prompt": prompts.text(20),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


async def _read_until_cut(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[SseStream, bool]:
    """Stream a completion; returns what arrived and whether the transport failed."""
    raw = b""
    failed = False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for chunk in resp.aiter_raw():
                raw += chunk
    except httpx.TransportError:
        failed = True
    return parse_sse(raw[: raw.rfind(b"\n\n") + 2] if b"\n\n" in raw else b""), failed


def _check_error_body(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["code"] == status and isinstance(error["message"], str)
    return error


async def test_faults_admin_route(sim: tuple[Target, httpx.AsyncClient]) -> None:
    _, client = sim
    assert (await client.get("/_sim/faults")).json() == FAULT_FIELDS
    updated = await _set(client, error_rate=0.25, stall_after_tokens=3)
    assert updated == {**FAULT_FIELDS, "error_rate": 0.25, "stall_after_tokens": 3}
    assert (await client.get("/_sim/faults")).json() == updated
    bad = await client.post("/_sim/faults", json={"no_such_fault": True})
    _check_error_body(bad, 400)
    assert (await client.get("/_sim/faults")).json() == updated


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_error_rate_one_answers_error_status(
    sim: tuple[Target, httpx.AsyncClient], prompts: Prompts, status: int
) -> None:
    tgt, client = sim
    await _set(client, error_rate=1.0, error_status=status)
    for stream in (False, True):
        resp = await client.post("/v1/completions", json=_gen_body(tgt, prompts, 4, stream))
        _check_error_body(resp, status)
    await _set(client, error_rate=0.0)
    assert (await complete(client, tgt, prompts.text(5)))["usage"]["completion_tokens"] == 4


async def test_reset_before_first_byte(
    sim: tuple[Target, httpx.AsyncClient], prompts: Prompts
) -> None:
    tgt, client = sim
    await _set(client, reset_before_first_byte=True)
    for stream in (False, True):
        with pytest.raises(httpx.TransportError):
            await client.post("/v1/completions", json=_gen_body(tgt, prompts, 4, stream))


async def test_reset_after_tokens_cuts_the_stream(
    sim: tuple[Target, httpx.AsyncClient], prompts: Prompts
) -> None:
    tgt, client = sim
    await _set(client, reset_after_tokens=3)
    stream, failed = await _read_until_cut(client, _gen_body(tgt, prompts, 20, True))
    assert failed, "the connection should be reset, not closed cleanly"
    assert not stream.done
    assert b"[DONE]" not in stream.raw
    # On loopback the bytes written before the RST are delivered ahead of the reset.
    assert len(stream.chunks) == 3
    assert all(c["choices"][0]["finish_reason"] is None for c in stream.chunks)


async def test_stall_before_first_byte(
    sim: tuple[Target, httpx.AsyncClient], prompts: Prompts
) -> None:
    tgt, client = sim
    await _set(client, stall_seconds=0.5)
    with pytest.raises(httpx.ReadTimeout):
        await client.post(
            "/v1/completions", json=_gen_body(tgt, prompts, 2, False), timeout=httpx.Timeout(0.2)
        )
    started = time.monotonic()
    async with client.stream("POST", "/v1/completions", json=_gen_body(tgt, prompts, 2, True)) as r:
        chunks = r.aiter_raw()
        first = await anext(chunks)
        waited = time.monotonic() - started
        rest = b"".join([c async for c in chunks])
    assert waited >= 0.45, waited
    assert parse_sse(first + rest).done


async def test_stall_after_tokens(sim: tuple[Target, httpx.AsyncClient], prompts: Prompts) -> None:
    tgt, client = sim
    await _set(client, stall_seconds=0.5, stall_after_tokens=2)
    arrivals: list[tuple[float, bytes]] = []
    async with client.stream("POST", "/v1/completions", json=_gen_body(tgt, prompts, 5, True)) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line.encode()))
    frames = [f for _, f in arrivals]
    assert frames[-1] == b"data: [DONE]"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    # The silence comes right after the second token and nowhere else.
    assert gaps[1] >= 0.45, gaps
    assert all(g < 0.45 for i, g in enumerate(gaps) if i != 1), gaps


async def test_unhealthy(sim: tuple[Target, httpx.AsyncClient]) -> None:
    _, client = sim
    await _set(client, unhealthy=True)
    assert (await client.get("/health")).status_code == 503
    assert (await client.get("/ping")).status_code == 503
    await _set(client, unhealthy=False)
    assert (await client.get("/health")).status_code == 200


async def test_slow_start(sim: tuple[Target, httpx.AsyncClient]) -> None:
    _, client = sim
    started = time.monotonic()
    await _set(client, slow_start_seconds=0.5)
    assert (await client.get("/health")).status_code == 503

    async def healthy() -> bool:
        return (await client.get("/health")).status_code == 200

    await wait_for(healthy, "/health 200 after the slow start", within=5.0)
    assert time.monotonic() - started >= 0.45


async def test_slow_start_from_config() -> None:
    from simulator import Faults

    async with (
        running_sim(sim_config(faults=Faults(slow_start_seconds=0.5))) as (tgt, _),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=5.0) as client,
    ):
        assert (await client.get("/health")).status_code == 503

        async def healthy() -> bool:
            return (await client.get("/health")).status_code == 200

        await wait_for(healthy, "/health 200 after the slow start", within=5.0)


async def test_dead(sim: tuple[Target, httpx.AsyncClient], prompts: Prompts) -> None:
    tgt, client = sim
    await _set(client, dead=True)
    assert (await client.get("/health")).status_code == 503
    for stream in (False, True):
        resp = await client.post("/v1/completions", json=_gen_body(tgt, prompts, 4, stream))
        error = _check_error_body(resp, 500)
        assert error["type"] == "InternalServerError"


async def test_dead_mid_stream_sends_error_event_without_done(prompts: Prompts) -> None:
    # Real time (time_scale 1) so the stream is still running when the engine dies.
    async with (
        running_sim(sim_config(time_scale=1.0)) as (tgt, _),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        raw = b""
        async with client.stream(
            "POST", "/v1/completions", json=_gen_body(tgt, prompts, 400, True)
        ) as resp:
            async for chunk in resp.aiter_raw():
                if not raw:
                    await _set(client, dead=True)
                raw += chunk
        stream = parse_sse(raw)
        assert not stream.done
        last = stream.chunks[-1]
        assert set(last) == {"error"}
        assert last["error"]["code"] == 500
        assert all("choices" in c for c in stream.chunks[:-1])


async def test_out_of_kv(sim: tuple[Target, httpx.AsyncClient], prompts: Prompts) -> None:
    tgt, client = sim
    await _set(client, out_of_kv=True)
    resp = await client.post("/v1/completions", json=_gen_body(tgt, prompts, 4, False))
    _check_error_body(resp, 500)
    await _set(client, out_of_kv=False)
    assert (await complete(client, tgt, prompts.text(5)))["usage"]["completion_tokens"] == 4


async def test_restart_cuts_streams_and_clears_the_cache(prompts: Prompts) -> None:
    # Real time (time_scale 1) so the stream is still running when the engine restarts.
    async with (
        running_sim(sim_config(time_scale=1.0)) as (tgt, _),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        assert tgt.zmq_endpoint is not None
        sub = KvSubscriber(tgt.zmq_endpoint)
        try:
            await _restart_while_streaming(tgt, client, sub, prompts)
        finally:
            sub.close()


async def _restart_while_streaming(
    tgt: Target, client: httpx.AsyncClient, sub: KvSubscriber, prompts: Prompts
) -> None:
    await sub.make_live(client, tgt, prompts)
    text, _ = await prompt_of(client, tgt, prompts, 3 * tgt.block_size + 2)
    assert cached_tokens((await complete(client, tgt, text, max_tokens=1))["usage"]) == 0
    before = len(sub.messages)
    raw = b""
    cut = False
    try:
        async with client.stream(
            "POST", "/v1/completions", json=_gen_body(tgt, prompts, 400, True)
        ) as resp:
            async for chunk in resp.aiter_raw():
                if not raw:
                    assert (await client.post("/_sim/restart")).status_code == 200
                raw += chunk
    except httpx.TransportError:
        cut = True
    assert cut, "an in-flight stream must be cut by the restart"
    assert b"[DONE]" not in raw

    await sub.until(
        lambda evs: any(isinstance(e, AllBlocksCleared) for e in evs[before:]),
        "AllBlocksCleared after the restart",
    )
    restarted = [m for m in sub.messages[before:] if m.seq == 0]
    assert restarted, [m.seq for m in sub.messages]
    assert any(isinstance(e, AllBlocksCleared) for e in restarted[0].batch.events)
    again = await complete(client, tgt, text, max_tokens=1)
    assert cached_tokens(again["usage"]) == 0
    await sub.until(lambda _: sub.messages[-1].seq >= 1, "events after the restart")
    tail = [m.seq for m in sub.messages[sub.messages.index(restarted[0]) :]]
    assert tail == list(range(len(tail))), tail
