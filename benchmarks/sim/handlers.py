"""HTTP routes of a replica: vLLM's OpenAI surface plus the /_sim admin endpoints."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from benchmarks.sim import protocol as P
from benchmarks.sim.config import SimError
from benchmarks.sim.engine import EngineRequest
from cache_index.errors import CacheIndexError

if TYPE_CHECKING:
    from benchmarks.sim.replica import Replica

__all__ = ["REPLICA", "add_routes"]

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
            raise P.ApiError(
                404, f"The model `{gen.model}` does not exist.", "NotFoundError", "model"
            )
        if gen.messages is not None:
            ids = rep.encode_prompt(rep.template.render(gen.messages), chat=True)
        elif gen.prompt is not None:
            ids = rep.encode_prompt(gen.prompt, chat=False)
        else:
            ids = gen.prompt_ids or []
        max_tokens = P.check_length(len(ids), gen.max_tokens, rep.config.max_model_len)
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
    req = EngineRequest(
        prompt_ids=ids,
        hashes=cache.block_hashes(ids, lora, gen.cache_salt) if cache.enable_prefix_caching else [],
        priority=gen.priority,
        lora_name=lora,
        request_id=rep.new_request_id(request.headers.get("X-Request-Id"), chat),
        max_tokens=max_tokens,
        eos_after=None if gen.ignore_eos else rep.config.eos_after_tokens,
    )
    rep.engine.submit(req)
    rep.inflight += 1
    try:
        if gen.stream:
            return await _stream(request, rep, req, gen, chat)
        return await _unary(request, rep, req, gen, chat)
    finally:
        rep.inflight -= 1
        if not req.done:
            rep.engine.finish(req, "abort")  # client gone: free the slot and blocks now


def _find_stop(text: str, start: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, max(0, start - len(s)))
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


async def _stream(
    request: web.Request, rep: Replica, req: EngineRequest, gen: P.GenRequest, chat: bool
) -> web.StreamResponse:
    created = int(time.time())
    frames = P.StreamFrames(req.request_id, created, gen.model, chat)
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    engine, vocab, interval = rep.engine, rep.vocab, rep.config.stream_interval
    offset = vocab.offset(req.prompt_ids)
    sent = 0
    text = ""
    stalled = False
    pending = frames.role() if chat else b""
    while True:
        f = rep.faults
        want = sent + interval if sent else 1
        if f.reset_after_tokens is not None and sent < f.reset_after_tokens:
            want = min(want, f.reset_after_tokens)
        await engine.wait(req, want)
        if req.error is not None:
            if req.error.kind == "restart":
                _reset(request)
                return resp
            await resp.write(pending + P.error_event(500, str(req.error)))
            return resp  # no [DONE]: the client must not mistake this for a complete answer
        n = min(req.num_generated, req.max_tokens)
        piece = vocab.text(offset, sent, n)
        finish = req.finish_reason
        stop_reason: str | None = None
        if gen.stop:
            hit = _find_stop(text + piece, len(text), gen.stop)
            if hit is not None:
                piece = (text + piece)[len(text) : hit[0]]
                finish, stop_reason = "stop", hit[1]
                engine.finish(req, "stop")
        text += piece if gen.stop else ""
        sent = n
        if finish is None:
            await resp.write(pending + frames.chunk(piece))
        else:
            await resp.write(pending + frames.final(piece, finish, stop_reason))
        pending = b""
        f = rep.faults
        if f.reset_after_tokens is not None and sent >= f.reset_after_tokens and finish is None:
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
        if finish is not None:
            break
    if gen.include_usage:
        await resp.write(frames.usage(_usage(rep, req, sent)))
    await resp.write(P.DONE)
    await resp.write_eof()
    return resp


def _usage(rep: Replica, req: EngineRequest, completion: int) -> dict[str, Any]:
    cached = req.num_cached_tokens or 0
    details = cached if rep.config.enable_prompt_tokens_details else None
    return P.usage(len(req.prompt_ids), completion, details)


async def _unary(
    request: web.Request, rep: Replica, req: EngineRequest, gen: P.GenRequest, chat: bool
) -> web.StreamResponse:
    engine, vocab = rep.engine, rep.vocab
    offset = vocab.offset(req.prompt_ids)
    stop_reason: str | None = None
    text = ""
    sent = 0
    while not req.done:
        # Without stop strings there is nothing to check per token: wait for the end at once.
        await engine.wait(req, sent + 1 if gen.stop else req.max_tokens)
        if req.error is not None:
            break
        n = min(req.num_generated, req.max_tokens)
        if gen.stop:
            piece = vocab.text(offset, sent, n)
            hit = _find_stop(text + piece, len(text), gen.stop)
            text += piece
            if hit is not None:
                text = text[: hit[0]]
                stop_reason = hit[1]
                engine.finish(req, "stop")
                req.finish_reason = "stop"
        sent = n
    if req.error is not None:
        if req.error.kind == "restart":
            return _reset(request)
        return _error(500, str(req.error))
    if not gen.stop:
        text = vocab.text(offset, 0, sent)
    body = P.chat_body if chat else P.completion_body
    return web.Response(
        body=body(req.request_id, int(time.time()), gen.model, text, req.finish_reason or "stop",
                  stop_reason, _usage(rep, req, sent)),
        content_type=_JSON,
    )  # fmt: skip


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
    return _json({"count": len(ids), "max_model_len": rep.config.max_model_len,
                  "tokens": ids, "token_strs": None})  # fmt: skip


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
    _rep(request).engine.reset_prefix_cache()
    return web.Response(status=200)


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
