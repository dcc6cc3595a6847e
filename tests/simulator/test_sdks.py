"""The official ``openai`` and ``anthropic`` SDKs, unchanged, against a simulated replica:
Responses (create, stream, retrieve, a stored follow-up, cancel) and Messages (create,
stream, count_tokens). With ``LLMGW_VLLM_URL`` set they run against that real vLLM instead."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import openai
import pytest

from tests.conformance.conftest import running_sim, sim_config, vllm_target
from tests.conformance.helpers import Target


@asynccontextmanager
async def _target(**sim_overrides: Any) -> AsyncIterator[Target]:
    url = os.environ.get("LLMGW_VLLM_URL")
    if url:
        yield await vllm_target(url)
        return
    async with running_sim(sim_config(**sim_overrides)) as (tgt, _):
        yield tgt


@pytest.fixture
async def sim() -> AsyncIterator[Target]:
    async with _target() as tgt:
        yield tgt


def _openai(tgt: Target) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=tgt.base_url + "/v1", api_key="sk-sim", max_retries=0)


def _anthropic(tgt: Target) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=tgt.base_url, api_key="sk-sim", max_retries=0)


async def test_openai_responses(sim: Target) -> None:
    async with _openai(sim) as client:
        first = await client.responses.create(
            model=sim.model, input="Remember the word banana", instructions="Be brief",
            max_output_tokens=4, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert first.id.startswith("resp_") and first.status == "incomplete"
        assert first.output_text and first.usage is not None
        assert first.usage.output_tokens == 4
        assert first.usage.input_tokens_details.cached_tokens == 0
        got = await client.responses.retrieve(first.id)
        assert got.output_text == first.output_text and got.usage == first.usage
        follow = await client.responses.create(
            model=sim.model, input="What was the word?", previous_response_id=first.id,
            max_output_tokens=3, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert follow.previous_response_id == first.id
        assert follow.usage is not None and follow.usage.input_tokens > first.usage.input_tokens
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve("resp_nope")
        with pytest.raises(openai.BadRequestError):
            await client.responses.cancel(first.id)


async def test_openai_responses_stream(sim: Target) -> None:
    async with _openai(sim) as client:
        stream = await client.responses.create(
            model=sim.model,
            input="stream please",
            max_output_tokens=5,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        kinds: list[str] = []
        text = ""
        final: Any = None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                final = event.response
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert final is not None and final.output_text == text and text
        async with client.responses.stream(
            model=sim.model,
            input="stream helper",
            max_output_tokens=3,
            extra_body={"ignore_eos": True},
        ) as helper:
            async for _ in helper:
                pass
            done = await helper.get_final_response()
        assert done.usage is not None and done.usage.output_tokens == 3


async def test_openai_background_cancel() -> None:
    # The simulator at a tenth of real speed: the answer is still running at the cancel.
    async with _target(time_scale=0.1) as tgt, _openai(tgt) as client:
        queued = await client.responses.create(
            model=tgt.model,
            input="long",
            max_output_tokens=tgt.max_model_len // 2,
            background=True,
            extra_body={"ignore_eos": True},
        )
        assert queued.status == "queued"
        cancelled = await client.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        assert (await client.responses.retrieve(queued.id)).status == "cancelled"


async def test_anthropic_messages(sim: Target) -> None:
    async with _anthropic(sim) as client:
        msgs: Any = [{"role": "user", "content": "Hello there"}]
        out = await client.messages.create(
            model=sim.model,
            max_tokens=4,
            system="Be brief",
            messages=msgs,
            extra_body={"temperature": 0.0},
        )
        assert out.id.startswith("chatcmpl-") and out.role == "assistant"
        assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 4
        (block,) = out.content
        assert block.type == "text" and block.text
        counted = await client.messages.count_tokens(model=sim.model, system="Be brief",
                                                     messages=msgs)  # fmt: skip
        usage = out.usage
        total = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert counted.input_tokens == total + (usage.cache_creation_input_tokens or 0)
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=4, messages=msgs)


async def test_anthropic_messages_stream(sim: Target) -> None:
    async with _anthropic(sim) as client:
        msgs: Any = [{"role": "user", "content": "Stream to me"}]
        async with client.messages.stream(
            model=sim.model,
            max_tokens=5,
            messages=msgs,
            extra_body={"temperature": 0.0},
        ) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert text and final.content[0].type == "text" and final.content[0].text == text
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
