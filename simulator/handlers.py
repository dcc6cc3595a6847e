"""Generation routes of a replica (completions, chat); the rest are in service_routes."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from simulator import protocol as P
from simulator import service_routes
from simulator.config import SimError
from simulator.engine import EngineRequest
from simulator.http_util import JSON, REPLICA, error_response, replica_of
from vllm_api.errors import VllmApiError
from vllm_api.sse import DONE_EVENT, error_event

if TYPE_CHECKING:
    from simulator.replica import Replica

__all__ = ["REPLICA", "add_routes", "fastapi_errors"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_DEAD_MSG = "Engine loop is not running. Inspect the stacktrace to find the original error."


def _reset(request: web.Request) -> web.Response:
    """Cut the TCP connection with an RST (SO_LINGER 0), no response bytes at all."""
    tr = request.transport
    if tr is not None:
        sock = tr.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tr.abort()
    return web.Response(status=500)  # never reaches the peer: the transport is gone


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
    f = rep.faults
    if f.dead:
        return error_response(500, _DEAD_MSG)
    if f.error_rate > 0 and rep.rng.random() < f.error_rate:
        return error_response(f.error_status, "Simulated upstream error")
    if f.reset_before_first_byte:
        return _reset(request)
    if f.stall_seconds > 0 and f.stall_after_tokens is None:
        await asyncio.sleep(f.stall_seconds)  # the fault itself: silence before the first byte
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
    cache = rep.engine.cache
    need = cache.blocks_for(len(ids) + 1)
    if f.out_of_kv or need > cache.num_blocks:
        return error_response(
            500, f"Insufficient KV cache: the request needs {need} blocks of {cache.block_size} "
            f"tokens; the cache has {cache.num_blocks}."
        )  # fmt: skip
    lora = gen.model if gen.model != rep.served[0] else None
    hashes = cache.block_hashes(ids, lora, gen.cache_salt) if cache.enable_prefix_caching else []
    request_id = rep.new_request_id(request.headers.get("X-Request-Id"), chat)
    base = rep.vocab.offset(ids)
    choices: list[_Choice] = []
    for i in range(gen.n):
        req = EngineRequest(
            prompt_ids=ids,
            hashes=hashes,
            priority=gen.priority,
            lora_name=lora,
            lora_id=None if lora is None else rep.served.index(lora),  # 1-based, like vLLM
            cache_salt=gen.cache_salt,
            # vLLM forks n > 1 into child requests named "<index>_<parent id>".
            request_id=request_id if gen.n == 1 else f"{i}_{request_id}",
            max_tokens=max_tokens,
            eos_after=None if gen.ignore_eos else rep.config.eos_after_tokens,
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


# Offsets of sibling choices into the output vocabulary: each choice gets its own text.
_CHOICE_STRIDE = 37


@dataclass(slots=True)
class _Choice:
    """Progress of one of the n choices of a request."""

    index: int
    req: EngineRequest
    offset: int
    sent: int = 0
    text: str = ""  # accumulated only when stop strings must be searched
    finish: str | None = None
    stop_reason: str | None = None


def _find_stop(text: str, start: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, max(0, start - len(s)))
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


def _advance(rep: Replica, c: _Choice, stops: tuple[str, ...]) -> str:
    """The text of `c` generated since the last call, cut before a stop string (ending it)."""
    req = c.req
    n = min(req.num_generated, req.max_tokens)
    piece = rep.vocab.text(c.offset, c.sent, n)
    c.sent = n
    c.finish = req.finish_reason
    if stops:
        hit = _find_stop(c.text + piece, len(c.text), stops)
        if hit is not None:
            piece = (c.text + piece)[len(c.text) : hit[0]]
            c.finish, c.stop_reason = "stop", hit[1]
            rep.engine.finish(req, "stop")
        c.text += piece
    return piece


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
    engine, interval = rep.engine, rep.config.stream_interval
    stalled = False
    pending = b"".join(frames.role(c.index) for c in choices) if chat else b""
    while True:
        out: list[bytes] = [pending]
        for c in choices:
            if c.finish is not None:
                continue
            f = rep.faults
            want = c.sent + interval if c.sent else 1
            if f.reset_after_tokens is not None and c.sent < f.reset_after_tokens:
                want = min(want, f.reset_after_tokens)
            # Siblings share engine steps, so waiting on them in turn delays none of them.
            await engine.wait(c.req, want)
            err = c.req.error
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
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    service_routes.add_routes(app)
