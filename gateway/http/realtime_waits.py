"""What a realtime session waits for before its relay: the client's model, then the replica.

Both waits watch the client: a frame it sends meanwhile is held, in order, for the replica
(within realtime_max_message_bytes), and its leaving ends the wait at once, so a session
queued for a saturated replica leaves the admission queue as an HTTP request would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson
from starlette.types import Message, Receive, Send

from gateway.config import ServerConfig
from gateway.errors import ModelNotFound, NoHealthyReplica, echo
from gateway.http.realtime_upstream import (
    GOING_AWAY,
    SERVICE_RESTART,
    TOO_BIG,
    Ending,
    Upstream,
    close_upstream,
)
from routing.types import Decision

# RFC 6455's "try again later": the model is served, but no replica of it is up (or free).
TRY_LATER = 1013
# Only a frame holding this can be a session.update: the rest pass unparsed.
_UPDATE = '"session.update"'
_GONE = Ending("client_closed", None, "", GOING_AWAY)
_DRAINED = Ending("drained", SERVICE_RESTART, "The gateway is shutting down.", GOING_AWAY)
_TOO_MUCH = Ending("message_too_big", TOO_BIG, "Too much sent before the session started.", 1001)


def event(kind: str, **fields: Any) -> Message:
    """One of vLLM's realtime events as a frame to the client."""
    return {"type": "websocket.send", "text": orjson.dumps({"type": kind, **fields}).decode()}


def error_event(message: str, code: str) -> Message:
    """vLLM's ErrorEvent."""
    return event("error", error=message, code=code)


def parse_event(text: str) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _size(msg: Message) -> int:
    text: str | None = msg.get("text")
    return len(text) if text is not None else len(msg.get("bytes") or b"")


async def await_model(
    receive: Receive,
    send: Send,
    held: list[Message],
    bind: Callable[[str], object],
    cfg: ServerConfig,
    stop: asyncio.Event,
) -> str | Ending:
    """The model of the first session.update `bind` takes; `held`: the frames up to it."""
    held_bytes = 0
    while True:
        try:
            async with asyncio.timeout(cfg.realtime_idle_timeout_s):
                msg = await _unless(receive(), stop)
        except TimeoutError:
            why = f"No session.update for {cfg.realtime_idle_timeout_s:g} s."
            return Ending("idle_timeout", 1001, why, 1001)
        if msg is None:
            return _DRAINED
        if msg["type"] == "websocket.disconnect":
            return _GONE
        held_bytes += _size(msg)
        if held_bytes > cfg.realtime_max_message_bytes:
            return _TOO_MUCH
        text: str | None = msg.get("text")
        parsed = parse_event(text) if text is not None else None
        if parsed is None or parsed.get("type") != "session.update":
            held.append(msg)  # the replica answers it, in order, once it is chosen
            continue
        model = parsed.get("model")
        # vLLM's answers to a session.update it cannot take (the connection stays open).
        if model is None:
            await send(error_event("Missing required field: model", "invalid_event"))
            continue
        try:
            if not isinstance(model, str):
                raise ModelNotFound(str(model))
            bind(model)
        except ModelNotFound:
            message = f"The model `{echo(str(model))}` does not exist."
            await send(error_event(message, "model_not_found"))
            continue
        except NoHealthyReplica as err:  # no replica discovered any model yet
            return Ending("no_replica", TRY_LATER, err.message, 1000)
        held.append(msg)
        return model


async def open_watched(
    opening: Coroutine[Any, Any, tuple[Upstream, Decision]],
    receive: Receive,
    held: list[Message],
    limit: int,
    release: Callable[[Upstream], None],
    stop: asyncio.Event,
) -> tuple[Upstream, Decision] | Ending:
    """`opening`'s socket, or how the session ended first (client gone, `limit` passed, drain)."""
    task = asyncio.ensure_future(opening)
    stopped = asyncio.ensure_future(stop.wait())
    held_bytes = sum(_size(m) for m in held)
    got: asyncio.Future[Message] | None = None
    try:
        while not task.done():
            if got is None:
                got = asyncio.ensure_future(receive())
            await asyncio.wait((task, got, stopped), return_when=asyncio.FIRST_COMPLETED)
            ending: Ending | None = None
            if got.done():
                msg, got = got.result(), None
                if msg["type"] == "websocket.disconnect":
                    ending = _GONE
                else:
                    held_bytes += _size(msg)
                    held.append(msg)
                    ending = _TOO_MUCH if held_bytes > limit else None
            elif stopped.done() and not task.done():
                ending = _DRAINED
            if ending is not None:
                task.cancel()
                await asyncio.wait((task,))
                if not task.cancelled() and task.exception() is None:
                    up, _ = task.result()  # it opened just as the client left
                    try:
                        await close_upstream(up, GOING_AWAY)
                    finally:
                        release(up)
                return ending
    finally:
        stopped.cancel()
        if got is not None:
            got.cancel()
        if not task.done():
            task.cancel()  # this task itself was cancelled: so is the wait
            with contextlib.suppress(BaseException):
                await task
    return task.result()


async def _unless(pending: Awaitable[Message], stop: asyncio.Event) -> Message | None:
    """`pending`'s message, or None once `stop` is set first (`pending` is then cancelled)."""
    got = asyncio.ensure_future(pending)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((got, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        got.cancel()
        stopped.cancel()
    return got.result() if got.done() and not got.cancelled() else None


def renamer(public: str, served: str) -> Callable[[str], str]:
    """A client frame as the replica gets it: a session.update naming `public`, `served`."""
    if public == served:
        return _same

    def rename(text: str) -> str:
        if _UPDATE not in text:  # audio appends, the bulk of a session, are never parsed
            return text
        parsed = parse_event(text)
        if parsed is None or parsed.get("type") != "session.update":
            return text
        if parsed.get("model") != public:
            return text
        return orjson.dumps({**parsed, "model": served}).decode()

    return rename


def _same(text: str) -> str:
    return text


def with_model(query: str, model: str) -> str:
    """`query` with its `model` parameter set to `model` (the version's served name)."""
    pairs = parse_qsl(query, keep_blank_values=True)
    if all(v == model for k, v in pairs if k == "model"):
        return query
    return urlencode([(k, model if k == "model" else v) for k, v in pairs])
