"""Generation routes of a replica (completions, chat); Responses, Messages and a pooling
replica's routes (pooling.py) are in their own modules, the rest in service_routes."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from simulator import audio, batch, messages, pooling, realtime, responses, scoring, service_routes
from simulator import generation as G
from simulator import protocol as P
from simulator.config import SimError
from simulator.generation import CHOICE_STRIDE as _CHOICE_STRIDE
from simulator.generation import Choice as _Choice
from simulator.generation import advance as _advance
from simulator.generation import reset as _reset
from simulator.http_util import JSON, REPLICA, error_response, replica_of
from vllm_api.errors import VllmApiError
from vllm_api.sse import DONE_EVENT, error_event

if TYPE_CHECKING:
    from simulator.replica import Replica

__all__ = ["REPLICA", "add_routes", "fastapi_errors"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@web.middleware
async def fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown path / wrong method answered as FastAPI does: JSON {"detail": <phrase>}."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        body = orjson.dumps({"detail": exc.reason})
        return web.Response(body=body, status=exc.status, content_type=JSON, headers=headers)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    rep = replica_of(request)
    if (early := await G.early_answer(request, rep)) is not None:
        return early
    try:
        gen = P.parse_gen(
            P.parse_body(await request.read()), chat=chat, default_model=rep.served[0]
        )
        if gen.model not in rep.served:
            # vLLM lists the base model's served names only, never the LoRA adapters.
            raise P.ApiError(
                404,
                f"The model `{gen.model}` does not exist. Valid aliases: {rep.served[0]}.",
                "NotFoundError",
                "model",
            )
        max_len = rep.config.max_model_len
        P.check_max_tokens(gen, max_len)
        if gen.messages is not None:
            text = rep.template.render(gen.messages)
            P.check_text_length(len(text), max_len, rep.max_chars_per_token)
            ids = rep.encode_prompt(text, chat=True)
        elif gen.prompt is not None:
            P.check_text_length(len(gen.prompt), max_len, rep.max_chars_per_token)
            ids = rep.encode_prompt(gen.prompt, chat=False)
        else:
            ids = gen.prompt_ids or []
        max_tokens = P.check_length(
            len(ids), gen.max_tokens, max_len, from_text=gen.prompt_ids is None
        )
    except P.ApiError as exc:
        return web.Response(body=exc.body(), status=exc.status, content_type=JSON)
    except (SimError, VllmApiError) as exc:  # e.g. a chat template that raised
        return error_response(400, str(exc))
    no_room = G.kv_refusal(rep, len(ids))
    if no_room is not None:
        return error_response(no_room.status, no_room.message)
    request_id = rep.new_request_id(request.headers.get("X-Request-Id"), chat)
    base = rep.vocab.offset(ids)
    choices: list[_Choice] = []
    for i in range(gen.n):
        req = G.new_request(
            rep,
            ids,
            model=gen.model,
            # vLLM forks n > 1 into child requests named "<index>_<parent id>".
            request_id=request_id if gen.n == 1 else f"{i}_{request_id}",
            max_tokens=max_tokens,
            priority=gen.priority,
            cache_salt=gen.cache_salt,
            ignore_eos=gen.ignore_eos,
        )
        rep.engine.submit(req)
        choices.append(_Choice(i, req, base + _CHOICE_STRIDE * i))
    rep.inflight += 1
    try:
        if gen.stream:
            return await _stream(request, rep, request_id, choices, gen, chat)
        return await _unary(request, rep, request_id, choices, gen, chat)
    finally:
        rep.inflight -= 1
        for c in choices:
            if not c.req.done:
                rep.engine.finish(c.req, "abort")  # client gone: free the slot and blocks now


async def _stream(
    request: web.Request,
    rep: Replica,
    request_id: str,
    choices: list[_Choice],
    gen: P.GenRequest,
    chat: bool,
) -> web.StreamResponse:
    frames = P.StreamFrames(request_id, int(time.time()), gen.model, chat)
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    stalled = False
    pending = b"".join(frames.role(c.index) for c in choices) if chat else b""
    while True:
        out: list[bytes] = [pending]
        for c in choices:
            if c.finish is not None:
                continue
            # Siblings share engine steps, so waiting on them in turn delays none of them.
            err = await G.next_chunk(rep, c)
            if err is not None:
                if err.kind == "restart":
                    _reset(request)
                    return resp
                await resp.write(b"".join(out) + error_event(str(err), 500))
                return resp  # no [DONE]: the client must not mistake this for a complete answer
            piece = _advance(rep, c, gen.stop)
            if c.finish is None:
                out.append(frames.chunk(piece, c.index))
            else:
                out.append(frames.final(piece, c.finish, c.stop_reason, c.index))
        await resp.write(b"".join(out))
        pending = b""
        sent = max(c.sent for c in choices)
        unfinished = any(c.finish is None for c in choices)
        f = rep.faults
        if f.reset_after_tokens is not None and sent >= f.reset_after_tokens and unfinished:
            _reset(request)
            return resp
        if (
            not stalled
            and f.stall_seconds > 0
            and f.stall_after_tokens is not None
            and sent >= f.stall_after_tokens
        ):
            stalled = True
            await asyncio.sleep(f.stall_seconds)  # the fault itself: silence mid-stream
        if not unfinished:
            break
    if gen.include_usage:
        await resp.write(frames.usage(_usage(rep, choices, chat, stream=True)))
    await resp.write(DONE_EVENT)
    await resp.write_eof()
    return resp


def _usage(rep: Replica, choices: list[_Choice], chat: bool, stream: bool) -> dict[str, Any]:
    # The prompt is counted once: vLLM prefills it for the first child, the others hit the cache.
    first = choices[0].req
    prompt = len(first.prompt_ids)
    cached = first.num_cached_tokens or 0
    cache = rep.engine.cache
    # vLLM's PrefillStats: full prompt blocks held after prefill, less those that were hits.
    full = prompt // cache.block_size * cache.block_size if cache.enable_prefix_caching else 0
    u = P.Usage(
        prompt,
        sum(c.sent for c in choices),
        cached if rep.config.enable_prompt_tokens_details else None,
        max(0, full - cached),
    )
    return P.usage_body(u, chat=chat, stream=stream)


async def _unary(
    request: web.Request,
    rep: Replica,
    request_id: str,
    choices: list[_Choice],
    gen: P.GenRequest,
    chat: bool,
) -> web.StreamResponse:
    engine = rep.engine
    for c in choices:
        req = c.req
        while True:
            # Without stop strings there is nothing to check per token: wait for the end at once.
            await engine.wait(req, c.sent + 1 if gen.stop else req.max_tokens)
            if req.error is not None:
                break
            _advance(rep, c, gen.stop)  # a sibling may have finished while we waited on another
            if req.done:
                break
        if req.error is not None:
            if req.error.kind == "restart":
                return _reset(request)
            return error_response(500, str(req.error))
        if not gen.stop:
            c.text = rep.vocab.text(c.offset, 0, c.sent)
    out = [P.Choice(c.index, c.text, c.finish or c.req.finish_reason or "stop", c.stop_reason)
           for c in choices]  # fmt: skip
    body = P.chat_body if chat else P.completion_body
    return web.Response(
        body=body(
            request_id, int(time.time()), gen.model, out, _usage(rep, choices, chat, stream=False)
        ),
        content_type=JSON,
    )


def add_routes(app: web.Application) -> None:
    # vLLM attaches a route family only when the model supports its task (its routers.py).
    if app[REPLICA].config.runner == "pooling":
        pooling.add_routes(app)
        scoring.add_routes(app)  # vLLM enables scoring for an embedding model
    elif app[REPLICA].config.runner == "transcription":
        audio.add_routes(app)  # a Whisper-type model's only task
    else:
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/chat/completions", chat_completions)
        batch.add_routes(app)
        responses.add_routes(app)
        messages.add_routes(app)
    realtime.add_routes(app)  # the WebSocket route, or the upgrade refusal without it
    service_routes.add_routes(app)
