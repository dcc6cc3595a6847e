"""/v1/chat/completions/batch as vLLM 0.32 serves it (openai/chat_completion/batch_serving.py).

N conversations, each its own engine request ("<id>_<i>") on this replica; one JSON answer
with a choice per conversation. There is no `stream` field: a stream asked for is ignored.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from simulator import generation as G
from simulator import protocol as P
from simulator.config import SimError
from simulator.http_util import JSON, api_error_response, error_response, replica_of
from vllm_api.errors import VllmApiError

if TYPE_CHECKING:
    from simulator.replica import Replica

_TOO_SHORT = "List should have at least 1 item after validation, not 0"


def _too_short(loc: str) -> P.ApiError:
    ctx = {"field_type": "List", "min_length": 1, "actual_length": 0}
    return P.validation_errors([P.field_error("too_short", loc, _TOO_SHORT, [], **ctx)])


def _check(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """BatchChatCompletionRequest's checks, in vLLM's order: its before-validator, then fields."""
    if body.get("use_beam_search"):
        raise P.bad_request(
            "Batch chat completions do not support beam search. "
            "Please set `use_beam_search` to False.",
            "use_beam_search",
        )
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise P.bad_request(
            "Batch chat completions do not support `n > 1`. Please set `n` to 1.", "n", n
        )
    if "messages" not in body:
        raise P.missing_field("messages", body)
    conversations = body["messages"]
    if not isinstance(conversations, list):
        raise P.validation_errors(
            [P.field_error("list_type", "messages", "Input should be a valid list", conversations)]
        )
    if not conversations:
        raise _too_short("messages")
    for i, conv in enumerate(conversations):
        if not isinstance(conv, list):
            msg = "Input should be a valid list"
            raise P.validation_errors([P.field_error("list_type", f"messages.{i}", msg, conv)])
        if not conv:
            raise _too_short(f"messages.{i}")
    choice = body.get("tool_choice", "none")
    if choice is not None and choice != "none":
        error = P.field_error(
            "literal_error", "tool_choice", "Input should be 'none'", choice,
            expected="'none'",
        )  # fmt: skip
        raise P.validation_errors([error])
    return conversations


def fingerprint(rep: Replica) -> str:
    """vLLM's system_fingerprint: its version and a hash of the engine's configuration."""
    from simulator.replica import VLLM_VERSION

    digest = hashlib.sha256(repr(rep.config).encode()).hexdigest()[:8]
    return f"vllm-{VLLM_VERSION}-{digest}"


def _message(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content, "refusal": None, "annotations": None,
            "audio": None, "function_call": None, "reasoning": None}  # fmt: skip


def _last_text(conv: list[dict[str, Any]], role: str) -> str:
    """echo: the last message's content, when it has the answer's role (parts joined)."""
    last = conv[-1]
    if not isinstance(last, dict) or last.get("role") != role:
        return ""
    content = last.get("content") or ""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


async def chat_batch(request: web.Request) -> web.StreamResponse:
    rep = replica_of(request)
    if (early := await G.early_answer(request, rep)) is not None:
        return early
    try:
        body = P.parse_body(await request.read())
        conversations = _check(body)
        model = body.get("model") or rep.served[0]
        if model not in rep.served:
            raise P.ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {rep.served[0]}.",
                "NotFoundError",
                "model",
            )
        max_len = rep.config.max_model_len
        gen_prompt = body.get("add_generation_prompt") is not False
        prepared: list[tuple[P.GenRequest, list[int], int]] = []
        for conv in conversations:
            # vLLM validates each conversation as a ChatCompletionRequest of its own.
            gen = P.parse_gen({**body, "messages": conv}, chat=True,
                              default_model=rep.served[0])  # fmt: skip
            P.check_max_tokens(gen, max_len)
            text = rep.template.render(conv, gen_prompt)
            P.check_text_length(len(text), max_len, rep.max_chars_per_token)
            ids = rep.encode_prompt(text, chat=True)
            prepared.append((gen, ids, P.check_length(len(ids), gen.max_tokens, max_len,
                                                      from_text=True)))  # fmt: skip
    except P.ApiError as exc:
        return api_error_response(exc)
    except (SimError, VllmApiError) as exc:
        return error_response(400, str(exc))
    no_room = G.kv_refusal(rep, max(len(ids) for _, ids, _ in prepared))
    if no_room is not None:
        return error_response(no_room.status, no_room.message)
    request_id = rep.new_request_id(request.headers.get("X-Request-Id"), chat=True)
    choices: list[G.Choice] = []
    for i, (gen, ids, max_tokens) in enumerate(prepared):
        req = G.new_request(
            rep, ids, model=model, request_id=f"{request_id}_{i}", max_tokens=max_tokens,
            priority=gen.priority, cache_salt=gen.cache_salt, ignore_eos=gen.ignore_eos,
        )  # fmt: skip
        rep.engine.submit(req)
        choices.append(G.Choice(i, req, rep.vocab.offset(ids)))
    rep.inflight += 1
    try:
        stops = prepared[0][0].stop
        texts = await asyncio.gather(*(G.complete(rep, c, stops) for c in choices))
    except G.EngineFailure as failure:
        return G.failure_answer(request, failure)
    finally:
        rep.inflight -= 1
        for c in choices:
            if not c.req.done:
                rep.engine.finish(c.req, "abort")  # client gone: free the slots now
    out = []
    for c, text, conv in zip(choices, texts, conversations, strict=True):
        role = "assistant" if gen_prompt else str(conv[-1].get("role"))
        content = (_last_text(conv, role) if body.get("echo") is True else "") + text
        out.append({"index": c.index, "message": _message(role, content), "logprobs": None,
                    "finish_reason": c.finish or c.req.finish_reason or "stop",
                    "stop_reason": c.stop_reason, "token_ids": None,
                    "routed_experts": None})  # fmt: skip
    prompt = sum(len(c.req.prompt_ids) for c in choices)
    completion = sum(c.sent for c in choices)
    usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
             "completion_tokens": completion, "prompt_tokens_details": None,
             "completion_tokens_details": None}  # fmt: skip
    answer = {"id": request_id, "object": "chat.completion", "created": int(time.time()),
              "model": model, "choices": out, "service_tier": None,
              "system_fingerprint": fingerprint(rep), "usage": usage, "prompt_logprobs": None,
              "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
              "ec_transfer_params": None, "metrics": None}  # fmt: skip
    return web.Response(body=orjson.dumps(answer), content_type=JSON)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions/batch", chat_batch)
