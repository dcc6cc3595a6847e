"""What every generation route of a replica shares: faults before the first byte, one request
through the engine, its text as it is generated, and its token counts."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from simulator import protocol as P
from simulator.engine import EngineFailure, EngineRequest
from simulator.http_util import error_response

if TYPE_CHECKING:
    from simulator.replica import Replica

DEAD_MSG = "Engine loop is not running. Inspect the stacktrace to find the original error."
# Offsets of sibling choices into the output vocabulary: each choice gets its own text.
CHOICE_STRIDE = 37


class StreamCut(Exception):
    """The connection was reset on purpose (a fault or an engine restart): write nothing."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer given before any generation: the route renders it in its own error shape."""

    status: int
    message: str


def reset(request: web.Request) -> web.Response:
    """Cut the TCP connection with an RST (SO_LINGER 0), no response bytes at all."""
    tr = request.transport
    if tr is not None:
        sock = tr.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tr.abort()
    return web.Response(status=500)  # never reaches the peer: the transport is gone


def failure_answer(request: web.Request, failure: EngineFailure) -> web.Response:
    """A non-streamed request's answer to an engine failure: a reset after a restart (as vLLM's
    dying API server gives), a 500 otherwise."""
    return reset(request) if failure.kind == "restart" else error_response(500, str(failure))


async def early_answer(
    request: web.Request,
    rep: Replica,
    render: Callable[[int, str], web.Response] = error_response,
) -> web.StreamResponse | None:
    """What the before-first-byte faults answer (a refusal in the route's own error shape, via
    `render`), or None: the request goes on."""
    refused = await before_first_byte(request, rep)
    if isinstance(refused, Refusal):
        return render(refused.status, refused.message)
    return refused


async def before_first_byte(request: web.Request, rep: Replica) -> Refusal | web.Response | None:
    """The faults that act before a request is parsed; a Response means the socket is gone."""
    f = rep.faults
    if f.dead:
        return Refusal(500, DEAD_MSG)
    if f.error_rate > 0 and rep.rng.random() < f.error_rate:
        return Refusal(f.error_status, "Simulated upstream error")
    if f.reset_before_first_byte:
        return reset(request)
    if f.stall_seconds > 0 and f.stall_after_tokens is None:
        await asyncio.sleep(f.stall_seconds)  # the fault itself: silence before the first byte
    return None


def kv_refusal(rep: Replica, num_prompt_tokens: int) -> Refusal | None:
    cache = rep.engine.cache
    need = cache.blocks_for(num_prompt_tokens + 1)
    if rep.faults.out_of_kv or need > cache.num_blocks:
        return Refusal(
            500, f"Insufficient KV cache: the request needs {need} blocks of {cache.block_size} "
            f"tokens; the cache has {cache.num_blocks}."
        )  # fmt: skip
    return None


@dataclass(slots=True)
class Choice:
    """Progress of one choice of a request."""

    index: int
    req: EngineRequest
    offset: int
    sent: int = 0
    text: str = ""  # accumulated only when stop strings must be searched
    finish: str | None = None
    stop_reason: str | None = None


def new_request(
    rep: Replica,
    ids: list[int],
    *,
    model: str,
    request_id: str,
    max_tokens: int,
    priority: int = 0,
    cache_salt: str | None = None,
    ignore_eos: bool = False,
) -> EngineRequest:
    """An engine request for `ids`, hashed for the prefix cache as vLLM hashes it."""
    cache = rep.engine.cache
    lora = model if model != rep.served[0] else None
    hashes = cache.block_hashes(ids, lora, cache_salt) if cache.enable_prefix_caching else []
    return EngineRequest(
        prompt_ids=ids,
        hashes=hashes,
        priority=priority,
        lora_name=lora,
        lora_id=None if lora is None else rep.served.index(lora),  # 1-based, like vLLM
        cache_salt=cache_salt,
        request_id=request_id,
        max_tokens=max_tokens,
        eos_after=None if ignore_eos else rep.config.eos_after_tokens,
    )


def scheduling(body: dict[str, Any]) -> tuple[int, str | None]:
    """The ``priority`` and ``cache_salt`` a request body asks for (ignored when malformed)."""
    priority = body.get("priority")
    salt = body.get("cache_salt")
    return (
        priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        salt if isinstance(salt, str) and salt else None,
    )


@asynccontextmanager
async def running(rep: Replica, req: EngineRequest) -> AsyncIterator[Choice]:
    """One request in the engine for the block's duration; aborted if the block leaves early
    (the client went away, a background response was cancelled)."""
    rep.engine.submit(req)
    rep.inflight += 1
    try:
        yield Choice(0, req, rep.vocab.offset(req.prompt_ids))
    finally:
        rep.inflight -= 1
        if not req.done:
            rep.engine.finish(req, "abort")  # free the slot and blocks now


def find_stop(text: str, start: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, max(0, start - len(s)))
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


def advance(rep: Replica, c: Choice, stops: tuple[str, ...]) -> str:
    """The text of `c` generated since the last call, cut before a stop string (ending it)."""
    req = c.req
    n = min(req.num_generated, req.max_tokens)
    piece = rep.vocab.text(c.offset, c.sent, n)
    c.sent = n
    c.finish = req.finish_reason
    if stops:
        hit = find_stop(c.text + piece, len(c.text), stops)
        if hit is not None:
            piece = (c.text + piece)[len(c.text) : hit[0]]
            c.finish, c.stop_reason = "stop", hit[1]
            rep.engine.finish(req, "stop")
        c.text += piece
    return piece


async def pieces(
    request: web.Request, rep: Replica, c: Choice, stops: tuple[str, ...] = ()
) -> AsyncIterator[str]:
    """The text of one streamed choice, a chunk (stream_interval tokens) at a time, with the
    mid-stream faults; raises EngineFailure (generation failed) or StreamCut (socket reset)."""
    stalled = False
    while c.finish is None:
        err = await next_chunk(rep, c)
        if err is not None:
            if err.kind == "restart":
                reset(request)
                raise StreamCut
            raise err
        yield advance(rep, c, stops)
        f = rep.faults
        if f.reset_after_tokens is not None and c.sent >= f.reset_after_tokens and c.finish is None:
            reset(request)
            raise StreamCut
        if (
            not stalled
            and f.stall_seconds > 0
            and f.stall_after_tokens is not None
            and c.sent >= f.stall_after_tokens
        ):
            stalled = True
            await asyncio.sleep(f.stall_seconds)  # the fault itself: silence mid-stream


async def next_chunk(rep: Replica, c: Choice) -> EngineFailure | None:
    """Wait for choice c's next chunk (stream_interval tokens, cut at the reset fault's
    token); the engine's failure, if generation failed."""
    f = rep.faults
    want = c.sent + rep.config.stream_interval if c.sent else 1
    if f.reset_after_tokens is not None and c.sent < f.reset_after_tokens:
        want = min(want, f.reset_after_tokens)
    await rep.engine.wait(c.req, want)
    return c.req.error


async def complete(rep: Replica, c: Choice, stops: tuple[str, ...] = ()) -> str:
    """The whole text of an unstreamed choice; raises EngineFailure when generation failed."""
    engine, req = rep.engine, c.req
    while True:
        # Without stop strings there is nothing to check per token: wait for the end at once.
        await engine.wait(req, c.sent + 1 if stops else req.max_tokens)
        if req.error is not None:
            raise req.error
        advance(rep, c, stops)
        if req.done:
            break
    if req.error is not None:
        raise req.error
    return c.text if stops else rep.vocab.text(c.offset, 0, c.sent)


def usage(rep: Replica, c: Choice) -> P.Usage:
    """Prompt, output, cache-hit and cache-written token counts (vLLM's PrefillStats): the
    full prompt blocks held after prefill less those that were hits."""
    prompt = len(c.req.prompt_ids)
    cached = c.req.num_cached_tokens or 0
    cache = rep.engine.cache
    full = prompt // cache.block_size * cache.block_size if cache.enable_prefix_caching else 0
    return P.Usage(prompt, c.sent, cached, max(0, full - cached))


__all__ = [
    "CHOICE_STRIDE",
    "DEAD_MSG",
    "Choice",
    "EngineFailure",
    "Refusal",
    "StreamCut",
    "advance",
    "before_first_byte",
    "complete",
    "early_answer",
    "find_stop",
    "kv_refusal",
    "new_request",
    "next_chunk",
    "pieces",
    "reset",
    "running",
    "scheduling",
    "usage",
]
