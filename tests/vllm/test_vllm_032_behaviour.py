"""vLLM 0.32.0's behaviour where it differs from tests/conformance (KNOWN_DIFFERENCES there):
pinned here so the list stays true, and so an engine upgrade shows what changed."""

from __future__ import annotations

import time

import httpx
import pytest
import zmq
import zmq.asyncio

from benchmarks.vllm_cpu import VllmFleet
from cache_index.kv_events import AllBlocksCleared, decode_batch, decode_seq, encode_seq
from tests.conformance.helpers import KvSubscriber, Prompts, Target, complete, prompt_of
from tests.vllm.conftest import TIMEOUT_S, reset_caches

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]


def _target(fleet: VllmFleet) -> Target:
    r = fleet.replicas[0]
    return Target(r.url, fleet.model, fleet.lora_name, r.kv_events_endpoint, fleet.block_size,
                  fleet.max_model_len, "vllm", r.replay_endpoint)  # fmt: skip


async def test_error_bodies(fleet: VllmFleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.replicas[0].url, timeout=60.0) as c:
        missing = (await c.post("/v1/completions", json={"model": fleet.model})).json()["error"]
        assert (missing["type"], missing["param"], missing["code"]) == (
            "BadRequestError",
            "prompt",
            400,
        )
        body = {"model": "nope", "prompt": "hi", "max_tokens": 1}
        unknown = (await c.post("/v1/completions", json=body)).json()["error"]
        assert (
            unknown["message"] == f"The model `nope` does not exist. Valid aliases: {fleet.model}."
        )
        long = {"model": fleet.model, "prompt": "alpha " * 2 * fleet.max_model_len, "max_tokens": 1}
        too_long = (await c.post("/v1/completions", json=long)).json()["error"]
        over = fleet.max_model_len + 1
        assert f"your prompt contains at least {over} input tokens" in too_long["message"]
        assert too_long["message"].endswith(f"(parameter=input_tokens, value={over})")
        # prompt + max_tokens over the context is clamped, not refused.
        fits = {"model": fleet.model, "prompt": "hi", "max_tokens": fleet.max_model_len - 1,
                "ignore_eos": True}  # fmt: skip
        resp = await c.post("/v1/completions", json=fits)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["total_tokens"] == fleet.max_model_len


async def test_prompt_tokens_details_present_on_a_cold_prompt(fleet: VllmFleet) -> None:
    target = _target(fleet)
    async with httpx.AsyncClient(base_url=target.base_url, timeout=60.0) as c:
        text, _ = await prompt_of(c, target, Prompts("cold", f"cold{time.time_ns()}"), 64)
        usage = (await complete(c, target, text))["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0


async def test_all_blocks_cleared_waits_for_the_next_step_and_replay_has_the_topic(
    fleet: VllmFleet,
) -> None:
    target = _target(fleet)
    assert target.zmq_endpoint and target.replay_endpoint
    prompts = Prompts("kv", f"kv{time.time_ns()}")
    sub = KvSubscriber(target.zmq_endpoint)
    try:
        async with httpx.AsyncClient(base_url=target.base_url, timeout=60.0) as c:
            await sub.make_live(c, target, prompts)
            await reset_caches(fleet, c)
            seen = len(sub.events)
            deadline = time.monotonic() + 1.0
            while (left := deadline - time.monotonic()) > 0:
                await sub.recv(left)
            cleared = [e for e in sub.events[seen:] if isinstance(e, AllBlocksCleared)]
            assert not cleared, "AllBlocksCleared came before any engine step"
            text, _ = await prompt_of(c, target, prompts, 40)
            await complete(c, target, text, max_tokens=1)
            await sub.until(lambda evs: any(isinstance(e, AllBlocksCleared) for e in evs), "clear")
    finally:
        sub.close()
    start = sub.messages[-1].seq
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(target.replay_endpoint)
        await dealer.send_multipart([b"", encode_seq(start)])
        assert await dealer.poll(timeout=10_000)
        empty, topic, seq, payload = await dealer.recv_multipart()
        assert (empty, topic, decode_seq(seq)) == (b"", b"kv", start)
        decode_batch(payload)
        assert await dealer.poll(timeout=10_000)
        assert await dealer.recv_multipart() == [b"", b"", encode_seq(-1), b""]
    finally:
        dealer.close(linger=0)
        ctx.term()
