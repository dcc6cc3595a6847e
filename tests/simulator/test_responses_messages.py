"""The simulator's Responses and Messages routes beyond what real vLLM shows the suite: faults,
the engine and prefix cache behind them, the response store's bound and its switch."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import running_sim, sim_config
from tests.conformance.helpers import Target, scrape, wait_for
from vllm_api.named_sse import NamedEvent, NamedSseParser

MSG = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def sim() -> AsyncIterator[tuple[Target, Any, httpx.AsyncClient]]:
    async with (
        running_sim(sim_config()) as (tgt, replica),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        yield tgt, replica, client


async def _faults(client: httpx.AsyncClient, **faults: Any) -> None:
    assert (await client.post("/_sim/faults", json=faults)).status_code == 200


def _bodies(tgt: Target, stream: bool, tokens: int = 4) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("/v1/responses", {"model": tgt.model, "input": "hello there", "stream": stream,
                           "max_output_tokens": tokens}),
        ("/v1/messages", {"model": tgt.model, "messages": MSG, "stream": stream,
                          "max_tokens": tokens}),
    ]  # fmt: skip


def _check_error(path: str, resp: httpx.Response, status: int, err_type: str, msg: str) -> None:
    assert resp.status_code == status, resp.text
    if path == "/v1/messages":
        assert resp.json() == {"type": "error", "error": {"type": err_type, "message": msg}}
    else:
        assert resp.json() == {"error": {"message": msg, "type": err_type, "param": None,
                                         "code": status}}  # fmt: skip


async def test_refusals_before_the_first_byte_use_each_routes_shape(
    sim: tuple[Target, Any, httpx.AsyncClient],
) -> None:
    tgt, _, client = sim
    await _faults(client, error_rate=1.0, error_status=503)
    for stream in (False, True):
        for path, body in _bodies(tgt, stream):
            resp = await client.post(path, json=body)
            _check_error(path, resp, 503, "ServiceUnavailableError", "Simulated upstream error")
    await _faults(client, error_rate=0.0, out_of_kv=True)
    for path, body in _bodies(tgt, False):
        resp = await client.post(path, json=body)
        assert resp.status_code == 500 and "Insufficient KV cache" in resp.text
    await _faults(client, out_of_kv=False, reset_before_first_byte=True)
    for path, body in _bodies(tgt, True):
        with pytest.raises(httpx.TransportError):
            await client.post(path, json=body)


async def _stream_events(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], on_event: Any = None
) -> tuple[list[NamedEvent], bool]:
    """The events that arrived and whether the transport failed (a reset)."""
    parser = NamedSseParser()
    events: list[NamedEvent] = []
    try:
        async with client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200
            async for chunk in resp.aiter_raw():
                for e in parser.feed(chunk):
                    events.append(e)
                    if on_event is not None:
                        await on_event(events)
    except httpx.TransportError:
        return events, True
    return events, False


def _deltas(events: list[NamedEvent]) -> int:
    return sum(e.name in ("response.output_text.delta", "content_block_delta") for e in events)


async def test_reset_after_tokens_cuts_both_streams(
    sim: tuple[Target, Any, httpx.AsyncClient],
) -> None:
    tgt, replica, client = sim
    await _faults(client, reset_after_tokens=3)
    for path, body in _bodies(tgt, True, tokens=20):
        events, failed = await _stream_events(client, path, body)
        assert failed, "the connection should be reset, not closed cleanly"
        assert _deltas(events) == 3
        assert events[-1].name in ("response.output_text.delta", "content_block_delta")

    async def idle() -> bool:
        return bool(replica.inflight == 0 and replica.engine.num_running == 0)

    await wait_for(idle, "the cut requests to leave the engine")


async def test_engine_death_mid_stream_ends_with_an_error_event(
    sim: tuple[Target, Any, httpx.AsyncClient],
) -> None:
    tgt, _, client = sim
    for path, body in _bodies(tgt, True, tokens=20):
        await _faults(client, dead=False, stall_seconds=0.5, stall_after_tokens=2)

        async def kill_at_two(events: list[NamedEvent]) -> None:
            if _deltas(events) == 2 and events[-1].name.endswith("delta"):
                await _faults(client, dead=True)  # lands during the stall after token 2

        events, failed = await _stream_events(client, path, body, kill_at_two)
        assert not failed
        assert _deltas(events) == 2
        last = json.loads(events[-1].data)
        assert events[-1].name == "error" and last["type"] == "error"
        if path == "/v1/messages":
            assert last["error"]["type"] == "internal_error" and last["error"]["message"]
        else:
            assert last["message"] and last["sequence_number"] == len(events) - 1
        names = {e.name for e in events}
        assert not names & {"response.completed", "message_stop", "message_delta"}


async def test_prefix_cache_and_metrics_see_the_new_routes(
    sim: tuple[Target, Any, httpx.AsyncClient],
) -> None:
    tgt, _, client = sim
    text = " ".join(f"word{i}" for i in range(120))
    before = await scrape(client)
    first = (await client.post("/v1/responses", json={"model": tgt.model, "input": text,
                                                      "max_output_tokens": 2})).json()  # fmt: skip
    follow = (await client.post("/v1/responses", json={
        "model": tgt.model, "input": "next", "previous_response_id": first["id"],
        "max_output_tokens": 2})).json()  # fmt: skip
    # The follow-up's prompt starts with the first one's: its full blocks are hits.
    n = first["usage"]["input_tokens"]
    hits = follow["usage"]["input_tokens_details"]["cached_tokens"]
    assert hits == n // tgt.block_size * tgt.block_size > 0
    body = {"model": tgt.model, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    # The builtin tokenizer has no BOS: this prompt is the first response's, already cached.
    once = (await client.post("/v1/messages", json=body)).json()["usage"]
    again = (await client.post("/v1/messages", json=body)).json()["usage"]
    assert once["cache_read_input_tokens"] == again["cache_read_input_tokens"] == hits
    after = await scrape(client)
    hit_total = after.value("vllm:prefix_cache_hits_total", model_name=tgt.model) - before.value(
        "vllm:prefix_cache_hits_total", model_name=tgt.model
    )
    reads = once["cache_read_input_tokens"] + again["cache_read_input_tokens"]
    assert hit_total == hits + reads
    gen = after.value("vllm:generation_tokens_total") - before.value("vllm:generation_tokens_total")
    assert gen == 8


async def test_store_keeps_only_the_newest() -> None:
    async with (
        running_sim(sim_config(responses_store_size=2)) as (tgt, _),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        ids = []
        for i in range(3):
            body = {"model": tgt.model, "input": f"turn {i}", "max_output_tokens": 1}
            ids.append((await client.post("/v1/responses", json=body)).json()["id"])
        codes = [(await client.get(f"/v1/responses/{rid}")).status_code for rid in ids]
        assert codes == [404, 200, 200]


async def test_store_switched_off_ignores_store() -> None:
    async with (
        running_sim(sim_config(responses_store=False)) as (tgt, _),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        body = {"model": tgt.model, "input": "hi", "max_output_tokens": 1, "store": True}
        first = await client.post("/v1/responses", json=body)
        assert first.status_code == 200
        assert (await client.get(f"/v1/responses/{first.json()['id']}")).status_code == 404
        follow = {**body, "previous_response_id": first.json()["id"]}
        assert (await client.post("/v1/responses", json=follow)).status_code == 404
        bg = await client.post("/v1/responses", json={**body, "background": True})
        assert bg.status_code == 400
        error = bg.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "background")
        assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in error["message"]


async def test_cancel_frees_the_engine() -> None:
    async with (
        running_sim(sim_config(time_scale=0.1)) as (tgt, replica),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        body = {"model": tgt.model, "input": "long", "max_output_tokens": 400, "background": True}
        rid = (await client.post("/v1/responses", json=body)).json()["id"]

        async def running() -> bool:
            return bool(replica.engine.num_running == 1)

        await wait_for(running, "the background request in the engine")
        assert (await client.post(f"/v1/responses/{rid}/cancel")).status_code == 200

        async def idle() -> bool:
            return bool(replica.inflight == 0 and replica.engine.num_running == 0)

        await wait_for(idle, "the cancelled request to leave the engine")
        assert (await client.get(f"/v1/responses/{rid}")).json()["status"] == "cancelled"


async def test_stop_after_eos_is_end_turn_and_completed() -> None:
    async with (
        running_sim(sim_config(eos_after_tokens=2)) as (tgt, _),
        httpx.AsyncClient(base_url=tgt.base_url, timeout=10.0) as client,
    ):
        msg = await client.post("/v1/messages", json={"model": tgt.model, "max_tokens": 9,
                                                      "messages": MSG})  # fmt: skip
        assert msg.json()["stop_reason"] == "end_turn"
        assert msg.json()["usage"]["output_tokens"] == 2
        resp = await client.post("/v1/responses", json={"model": tgt.model, "input": "x",
                                                        "max_output_tokens": 9})  # fmt: skip
        out = resp.json()
        assert (out["status"], out["incomplete_details"]) == ("completed", None)
        assert out["usage"]["output_tokens"] == 2
        # vLLM's Responses take its extra ignore_eos: the answer runs to its limit.
        body = {"model": tgt.model, "input": "x", "max_output_tokens": 9, "ignore_eos": True}
        out = (await client.post("/v1/responses", json=body)).json()
        assert (out["status"], out["usage"]["output_tokens"]) == ("incomplete", 9)


async def test_cache_salt_separates_the_prefix_cache(
    sim: tuple[Target, Any, httpx.AsyncClient],
) -> None:
    tgt, _, client = sim
    text = " ".join(f"salted{i}" for i in range(100))

    async def responses_hits(salt: str) -> int:
        body = {"model": tgt.model, "input": text, "max_output_tokens": 1, "cache_salt": salt}
        out = (await client.post("/v1/responses", json=body)).json()
        return int(out["usage"]["input_tokens_details"]["cached_tokens"])

    async def messages_hits(salt: str) -> int:
        body = {"model": tgt.model, "max_tokens": 1, "cache_salt": salt,
                "messages": [{"role": "user", "content": text}]}  # fmt: skip
        out = (await client.post("/v1/messages", json=body)).json()
        return int(out["usage"]["cache_read_input_tokens"])

    for hits in (responses_hits, messages_hits):
        assert await hits(f"{hits.__name__}-a") == 0
        assert await hits(f"{hits.__name__}-b") == 0
        assert await hits(f"{hits.__name__}-a") > 0
