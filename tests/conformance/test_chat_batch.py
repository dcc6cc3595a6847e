"""/v1/chat/completions/batch (vLLM 0.32: openai/chat_completion/batch_serving.py): one choice
per conversation, usage summed over them, no streaming (a `stream` sent is ignored), n and
beam search refused; and the audio routes, which a generative model's server does not have."""

from __future__ import annotations

import httpx
import pytest

from tests.conformance.helpers import Prompts, Target

BATCH = "/v1/chat/completions/batch"


def _conversations(prompts: Prompts) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": prompts.text(6)}],
        [
            {"role": "system", "content": prompts.text(4)},
            {"role": "user", "content": prompts.text(8)},
        ],
        [{"role": "user", "content": prompts.text(3)}],
    ]


async def _prompt_tokens(
    client: httpx.AsyncClient, target: Target, conv: list[dict[str, str]]
) -> int:
    r = await client.post(
        "/v1/chat/completions", json={"model": target.model, "messages": conv, "max_tokens": 1}
    )
    assert r.status_code == 200, r.text
    tokens: int = r.json()["usage"]["prompt_tokens"]
    return tokens


async def test_batch_answers_one_choice_per_conversation_with_summed_usage(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    convs = _conversations(prompts)
    r = await client.post(
        BATCH,
        json={"model": target.model, "messages": convs, "max_tokens": 3, "ignore_eos": True},
        headers={"X-Request-Id": "batch-conformance"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"] == "chatcmpl-batch-conformance"
    assert body["model"] == target.model
    assert str(body["system_fingerprint"]).startswith("vllm-0.32.0-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for choice in body["choices"]:
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] == "length"
        assert choice["stop_reason"] is None
        assert {"logprobs", "token_ids"} <= choice.keys()
    usage = body["usage"]
    assert usage["completion_tokens"] == 9
    expected = [await _prompt_tokens(client, target, conv) for conv in convs]
    assert usage["prompt_tokens"] == sum(expected)
    assert usage["total_tokens"] == usage["prompt_tokens"] + 9
    # Unlike /v1/chat/completions, the batch's usage never carries prompt-token details.
    assert usage["prompt_tokens_details"] is None


async def test_batch_ignores_stream_and_answers_json(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    convs = _conversations(prompts)[:2]
    r = await client.post(
        BATCH,
        json={"model": target.model, "messages": convs, "max_tokens": 2, "stream": True,
              "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert len(r.json()["choices"]) == 2


async def test_batch_lora_and_no_model(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    convs = _conversations(prompts)[:1]
    r = await client.post(BATCH, json={"messages": convs, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == target.model
    if target.lora is not None:
        r = await client.post(
            BATCH, json={"model": target.lora, "messages": convs, "max_tokens": 2}
        )
        assert r.status_code == 200, r.text
        assert r.json()["model"] == target.lora


@pytest.mark.parametrize(
    ("extra", "param", "phrase"),
    [
        ({"n": 2}, "n", "Batch chat completions do not support `n > 1`. Please set `n` to 1."),
        ({"use_beam_search": True}, "use_beam_search", "do not support beam search"),
        ({"tool_choice": "auto"}, "body.tool_choice", "Input should be 'none'"),
    ],
)
async def test_batch_refuses_what_vllm_refuses(
    client: httpx.AsyncClient,
    target: Target,
    prompts: Prompts,
    extra: dict[str, object],
    param: str,
    phrase: str,
) -> None:
    body = {"model": target.model, "messages": _conversations(prompts)[:1], **extra}
    r = await client.post(BATCH, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert phrase in error["message"]


@pytest.mark.parametrize(
    ("messages", "param", "phrase"),
    [
        ([], "body.messages", "List should have at least 1 item after validation, not 0"),
        ([[]], "body.messages.0", "List should have at least 1 item after validation, not 0"),
        ([{"role": "user", "content": "x"}], "body.messages.0", "Input should be a valid list"),
        (None, "body.messages", "Field required"),
    ],
)
async def test_batch_validates_its_conversations(
    client: httpx.AsyncClient, target: Target, messages: object, param: str, phrase: str
) -> None:
    body: dict[str, object] = {"model": target.model}
    if messages is not None:
        body["messages"] = messages
    r = await client.post(BATCH, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("Bad Request", param)
    assert phrase in error["message"]


async def test_batch_unknown_model_and_too_long(
    client: httpx.AsyncClient, target: Target, prompts: Prompts
) -> None:
    r = await client.post(
        BATCH, json={"model": "no-such-model", "messages": [[{"role": "user", "content": "hi"}]]}
    )
    assert r.status_code == 404, r.text
    assert r.json()["error"]["message"] == (
        f"The model `no-such-model` does not exist. Valid aliases: {target.model}."
    )
    r = await client.post(
        BATCH,
        json={"model": target.model, "messages": [[{"role": "user", "content": "hi"}]],
              "max_tokens": target.max_model_len + 1},
    )  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
async def test_a_generative_model_serves_no_audio_route(
    client: httpx.AsyncClient, target: Target, path: str
) -> None:
    # vLLM registers the speech-to-text routers only for a model with the transcription task.
    files = {"file": ("a.wav", b"RIFF\x00\x00\x00\x00WAVE", "audio/wav")}
    r = await client.post(path, files=files, data={"model": target.model})
    assert r.status_code == 404, r.text
    assert r.json() == {"detail": "Not Found"}
