"""The official ``openai`` and ``anthropic`` SDKs, unchanged, against the gateway in front of
the real 2-replica fleet: chat, completions, Responses (create, stream, GET, stored follow-ups
pinned to the replica that keeps them, cancel), Messages (streamed and not), count_tokens and
the model list. Generations stay a few tokens long: the fleet runs on two shared cores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import pytest_asyncio

from benchmarks.vllm_cpu import VllmFleet
from gateway.process import RunningGateway
from tests.vllm.conftest import MAX_MODEL_LEN, TIMEOUT_S, gateway_for

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

# Greedy: the tiny model samples EOS at temperature 1, and Messages has no ignore_eos.
GREEDY = {"temperature": 0.0}
EXACT = {"ignore_eos": True}


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def gateway(fleet: VllmFleet) -> AsyncIterator[RunningGateway]:
    """Round robin: consecutive new conversations land on both replicas in turn."""
    async with gateway_for(fleet, profile="round_robin") as (gw, _):
        yield gw


def _openai(gw: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)


def _anthropic(gw: RunningGateway) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0)


async def test_models_list(gateway: RunningGateway, fleet: VllmFleet) -> None:
    async with _openai(gateway) as client:
        cards = {m.id: m.to_dict() for m in (await client.models.list()).data}
    lora = fleet.lora_name
    assert lora is not None and set(cards) == {fleet.model, lora}
    assert cards[fleet.model]["max_model_len"] == MAX_MODEL_LEN
    assert cards[lora]["parent"] == fleet.model


async def test_chat_and_completions(gateway: RunningGateway, fleet: VllmFleet) -> None:
    msgs: Any = [{"role": "user", "content": "Hello there"}]
    async with _openai(gateway) as client:
        chat = await client.chat.completions.create(
            model=fleet.model, messages=msgs, max_tokens=4, extra_body=EXACT
        )
        assert chat.object == "chat.completion" and chat.model == fleet.model
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 4
        stream = await client.chat.completions.create(
            model=fleet.model, messages=msgs, max_tokens=4, stream=True,
            stream_options={"include_usage": True}, extra_body=EXACT,
        )  # fmt: skip
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        done = await client.completions.create(
            model=fleet.model, prompt="alpha bravo", max_tokens=3, extra_body=EXACT
        )
        assert done.object == "text_completion" and done.choices[0].text
        assert done.usage is not None and done.usage.completion_tokens == 3
        pieces = await client.completions.create(
            model=fleet.model, prompt="alpha bravo", max_tokens=3, stream=True, extra_body=EXACT
        )
        streamed = [c async for c in pieces]
        assert "".join(c.choices[0].text for c in streamed if c.choices)
        assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="nope", prompt="x", max_tokens=1)


async def _holders(fleet: VllmFleet, response_id: str) -> list[str]:
    """Names of the replicas that keep `response_id` (vLLM's store is per process)."""
    names = []
    async with httpx.AsyncClient(timeout=30.0) as c:
        for r in fleet.replicas:
            got = await c.get(f"{r.url}/v1/responses/{response_id}")
            assert got.status_code in (200, 404), got.text
            if got.status_code == 200:
                names.append(r.name)
    return names


async def test_responses_create_stream_get_and_cancel(
    gateway: RunningGateway, fleet: VllmFleet
) -> None:
    async with _openai(gateway) as client:
        first = await client.responses.create(
            model=fleet.model, input="Remember the word banana", instructions="Be brief",
            max_output_tokens=4, extra_body=EXACT,
        )  # fmt: skip
        assert first.id.startswith("resp_") and first.status == "incomplete"
        assert first.output_text and first.usage is not None
        assert first.usage.output_tokens == 4
        got = await client.responses.retrieve(first.id)
        assert got.id == first.id and got.output_text == first.output_text
        assert got.usage == first.usage
        # vLLM cancels only background responses: a finished one is its 400.
        with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
            await client.responses.cancel(first.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve("resp_nope")

        stream = await client.responses.create(
            model=fleet.model, input="stream please", max_output_tokens=4, stream=True,
            extra_body=EXACT,
        )  # fmt: skip
        kinds: list[str] = []
        text, final = "", None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                final = event.response
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert final is not None and text and final.output_text == text
        assert (await client.responses.retrieve(final.id)).output_text == text
        async with client.responses.stream(
            model=fleet.model, input="stream helper", max_output_tokens=3, extra_body=EXACT
        ) as helper:
            async for _ in helper:
                pass
            done = await helper.get_final_response()
        assert done.usage is not None and done.usage.output_tokens == 3


async def test_stored_follow_ups_reach_the_replica_that_keeps_them(
    gateway: RunningGateway, fleet: VllmFleet
) -> None:
    async with _openai(gateway) as client:
        heads = [
            await client.responses.create(
                model=fleet.model,
                input=f"Conversation {i}: remember {word}",
                max_output_tokens=2,
                extra_body=EXACT,
            )
            for i, word in enumerate(("apple", "pear", "plum", "fig"))
        ]
        holders = {h.id: await _holders(fleet, h.id) for h in heads}
        assert all(len(names) == 1 for names in holders.values()), holders
        assert {names[0] for names in holders.values()} == {r.name for r in fleet.replicas}
        # Two turns on each conversation: every follow-up must reach its chain's replica.
        for head in heads:
            previous, home = head, holders[head.id][0]
            for turn in range(2):
                follow = await client.responses.create(
                    model=fleet.model, input=f"Turn {turn}: what was the word?",
                    previous_response_id=previous.id, max_output_tokens=2, extra_body=EXACT,
                )  # fmt: skip
                assert follow.previous_response_id == previous.id
                assert follow.usage is not None and previous.usage is not None
                assert follow.usage.input_tokens > previous.usage.input_tokens
                assert await _holders(fleet, follow.id) == [home]
                previous = follow


async def test_anthropic_messages(gateway: RunningGateway, fleet: VllmFleet) -> None:
    msgs: Any = [{"role": "user", "content": "Hello there"}]
    async with _anthropic(gateway) as client:
        out = await client.messages.create(
            model=fleet.model, max_tokens=4, system="Be brief", messages=msgs, extra_body=GREEDY
        )
        assert out.id.startswith("chatcmpl-") and out.role == "assistant"
        assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 4
        (block,) = out.content
        assert block.type == "text" and block.text
        counted = await client.messages.count_tokens(
            model=fleet.model, system="Be brief", messages=msgs
        )
        usage = out.usage
        total = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert counted.input_tokens == total + (usage.cache_creation_input_tokens or 0)
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=4, messages=msgs)


async def test_anthropic_messages_stream(gateway: RunningGateway, fleet: VllmFleet) -> None:
    msgs: Any = [{"role": "user", "content": "Stream to me"}]
    async with _anthropic(gateway) as client:
        raw = await client.messages.create(
            model=fleet.model, max_tokens=4, messages=msgs, stream=True, extra_body=GREEDY
        )
        names = [event.type async for event in raw]
        deltas = names.count("content_block_delta")
        assert deltas >= 1
        assert names == ["message_start", "content_block_start",
                         *["content_block_delta"] * deltas, "content_block_stop",
                         "message_delta", "message_stop"]  # fmt: skip
        async with client.messages.stream(
            model=fleet.model, max_tokens=5, messages=msgs, extra_body=GREEDY
        ) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert text and final.content[0].type == "text" and final.content[0].text == text
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
