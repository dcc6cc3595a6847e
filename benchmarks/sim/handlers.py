"""HTTP routes of a replica: vLLM's OpenAI surface plus the /_sim admin endpoints."""

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

from benchmarks.sim import protocol as P
from benchmarks.sim.config import SimError
from benchmarks.sim.engine import EngineRequest
from cache_index.errors import CacheIndexError

if TYPE_CHECKING:
    from benchmarks.sim.replica import Replica

__all__ = ["REPLICA", "add_routes", "fastapi_errors"]

REPLICA: web.AppKey[Replica] = web.AppKey("sim_replica")
_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_DEAD_MSG = "Engine loop is not running. Inspect the stacktrace to find the original error."


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=_JSON)


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = P.error_body(status, message, P.error_type(status), param)
    return web.Response(body=body, status=status, content_type=_JSON)


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
        return web.Response(body=body, status=exc.status, content_type=_JSON, headers=headers)


def _rep(request: web.Request) -> Replica:
    return request.app[REPLICA]


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    rep = _rep(request)
    f = rep.faults
    if f.dead:
        return _error(500, _DEAD_MSG)
    if f.error_rate > 0 and rep.rng.random() < f.error_rate:
        return _error(f.error_status, "Simulated upstream error")
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
        return web.Response(body=exc.body(), status=exc.status, content_type=_JSON)
    except (SimError, CacheIndexError) as exc:  # e.g. a chat template that raised
        return _error(400, str(exc))
    cache = rep.engine.cache
    need = cache.blocks_for(len(ids) + 1)
    if f.out_of_kv or need > cache.num_blocks:
        return _error(
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
                await resp.write(b"".join(out) + P.error_event(500, str(err)))
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
    await resp.write(P.DONE)
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
            return _error(500, str(req.error))
        if not gen.stop:
            c.text = rep.vocab.text(c.offset, 0, c.sent)
    out = [P.Choice(c.index, c.text, c.finish or c.req.finish_reason or "stop", c.stop_reason)
           for c in choices]  # fmt: skip
    body = P.chat_body if chat else P.completion_body
    return web.Response(
        body=body(
            request_id, int(time.time()), gen.model, out, _usage(rep, choices, chat, stream=False)
        ),
        content_type=_JSON,
    )


async def models(request: web.Request) -> web.Response:
    rep = _rep(request)
    base = rep.served[0]

    def card(mid: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
        perm = {"id": f"modelperm-{rep.name}", "object": "model_permission",
                "created": rep.created, "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False}  # fmt: skip
        return {"id": mid, "object": "model", "created": rep.created, "owned_by": "vllm",
                "root": mid if parent is None else f"/loras/{mid}", "parent": parent,
                "max_model_len": max_len, "permission": [perm]}  # fmt: skip

    data = [card(base, None, rep.config.max_model_len)]
    data += [card(name, base, None) for name in rep.served[1:]]
    return _json({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _rep(request).healthy() else 503)


async def ping(request: web.Request) -> web.Response:
    return web.Response(status=200 if _rep(request).healthy() else 503)


async def load(request: web.Request) -> web.Response:
    return _json({"server_load": _rep(request).inflight})


async def version(request: web.Request) -> web.Response:
    from benchmarks.sim.replica import VLLM_VERSION

    return _json({"version": VLLM_VERSION})


async def metrics(request: web.Request) -> web.Response:
    body = _rep(request).metrics()
    return web.Response(
        body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


async def tokenize(request: web.Request) -> web.Response:
    rep = _rep(request)
    try:
        body = P.parse_body(await request.read())
        if isinstance(body.get("messages"), list):
            gen = body.get("add_generation_prompt", True) is not False
            ids = rep.encode_prompt(rep.template.render(body["messages"], gen), chat=True)
        elif isinstance(body.get("prompt"), str):
            ids = rep.encode_prompt(body["prompt"], chat=False)
        else:
            raise P.invalid("prompt (string) or messages (list) is required")
    except P.ApiError as exc:
        return web.Response(body=exc.body(), status=exc.status, content_type=_JSON)
    except (SimError, CacheIndexError) as exc:
        return _error(400, str(exc))
    strs = None
    if body.get("return_token_strs") is True:
        # The Tokenizer protocol has no id -> piece lookup: a one-token decode stands in for it.
        strs = [rep.tokenizer.decode([t]) for t in ids]
    return _json({"count": len(ids), "max_model_len": rep.config.max_model_len,
                  "tokens": ids, "token_strs": strs})  # fmt: skip


async def detokenize(request: web.Request) -> web.Response:
    rep = _rep(request)
    try:
        body = P.parse_body(await request.read())
    except P.ApiError as exc:
        return web.Response(body=exc.body(), status=exc.status, content_type=_JSON)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return _error(400, "tokens must be a list of ints", "tokens")
    return _json({"prompt": rep.tokenizer.decode(tokens)})


async def kv_event_sources(request: web.Request) -> web.Response:
    rep = _rep(request)
    if rep.publisher is None:
        return _json({})
    return _json({"0": {"enable_kv_cache_events": True, "publisher": "zmq",
                        "endpoint": rep.kv_events_endpoint, "topic": rep.config.kv_events_topic,
                        "replay_endpoint": rep.replay_endpoint}})  # fmt: skip


async def get_faults(request: web.Request) -> web.Response:
    return _json(_rep(request).faults.to_json())


async def post_faults(request: web.Request) -> web.Response:
    rep = _rep(request)
    try:
        patch = P.parse_body(await request.read())
        return _json(rep.set_faults(patch).to_json())
    except P.ApiError as exc:
        return web.Response(body=exc.body(), status=exc.status, content_type=_JSON)
    except SimError as exc:
        return _error(400, str(exc))


async def restart(request: web.Request) -> web.Response:
    _rep(request).restart()
    return _json({"restarted": True})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    # vLLM answers 200 either way; success is false while a request still holds blocks.
    return _json({"success": _rep(request).engine.reset_prefix_cache()})


async def timings(request: web.Request) -> web.Response:
    """Modelled vs delivered timing per finished request (for the capacity benchmark)."""
    recs = _rep(request).engine.timings
    return _json([[t.request_id, t.tokens, t.modelled_ttft, t.modelled_itl, t.engine_ttft,
                   t.engine_itl] for t in recs])  # fmt: skip


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", ping)
    app.router.add_post("/ping", ping)
    app.router.add_get("/load", load)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/kv_event_sources", kv_event_sources)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/_sim/faults", get_faults)
    app.router.add_post("/_sim/faults", post_faults)
    app.router.add_post("/_sim/restart", restart)
    app.router.add_get("/_sim/timings", timings)
