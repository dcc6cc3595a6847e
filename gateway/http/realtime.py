"""/v1/realtime: vLLM's realtime transcription WebSocket, relayed to one replica of its model.

vLLM names the model in-band: the client connects, reads session.created, then sends
session.update {"model": ...} (vllm/entrypoints/speech_to_text/realtime/connection.py). A
client naming it in the URL as OpenAI's SDK does (`?model=`) is routed before the upgrade,
and refused with an HTTP error in vLLM's shape. Any other gets the gateway's session.created
(the replica's own is dropped later) and its frames are held, in order, until a
session.update names a model the fleet serves; then the replica's socket opens and the held
frames go first. Keys: `Authorization: Bearer` or `x-api-key` on the upgrade, or, from a
browser (which cannot set headers), OpenAI's `openai-insecure-api-key.<key>` subprotocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import orjson
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import GatewayError, ModelNotFound, NoHealthyReplica, UpstreamFailed, echo
from gateway.http.hot_io import request_id_of
from gateway.http.realtime_upstream import (
    BAD_GATEWAY,
    TOO_BIG,
    Ending,
    RealtimeUnsupported,
    Upstream,
    open_upstream,
    reason,
    relay,
)
from gateway.runtime import Runtime

log = logging.getLogger("llm_gateway.realtime")

_KEY_PROTOCOL = "openai-insecure-api-key."
# The subprotocol OpenAI's browser clients offer beside the key; chosen back when offered.
_SUBPROTOCOL = "realtime"
# RFC 6455's "try again later": the model is served, but no replica of it is up.
_TRY_LATER = 1013
_UNKNOWN_MODEL = "_unknown"


def _event(kind: str, **fields: Any) -> Message:
    return {"type": "websocket.send", "text": orjson.dumps({"type": kind, **fields}).decode()}


def _error(message: str, code: str) -> Message:
    """vLLM's ErrorEvent."""
    return _event("error", error=message, code=code)


class RealtimeRelay:
    """The ASGI app of /v1/realtime: authenticate, route, relay, count."""

    def __init__(
        self, runtime: Runtime, authorize: Callable[[list[tuple[bytes, bytes]]], str]
    ) -> None:
        self._runtime = runtime
        self._authorize = authorize
        self._open = 0
        self._rid_header = runtime.config.server.request_id_header.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        runtime = self._runtime
        cfg = runtime.config.server
        request_id = request_id_of(scope["headers"], self._rid_header)
        offered: list[str] = list(scope.get("subprotocols", ()))
        query = scope.get("query_string", b"").decode("latin-1")
        model = _query_model(query)
        try:
            self._authorize(_credentials(scope["headers"], offered))
            if runtime.draining:
                raise NoHealthyReplica("The gateway is shutting down.")
            if self._open >= cfg.realtime_max_sessions:
                raise NoHealthyReplica("Too many realtime sessions are open; try again later.")
        except GatewayError as err:
            self._count(model, _refusal(err))
            await _refuse(scope, send, err, request_id)
            return
        self._open += 1
        started = time.perf_counter()
        try:
            await self._session(scope, receive, send, request_id, offered, query, model, started)
        finally:
            self._open -= 1

    async def _session(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        offered: list[str],
        query: str,
        model: str | None,
        started: float,
    ) -> None:
        runtime = self._runtime
        accept: Message = {"type": "websocket.accept"}
        if _SUBPROTOCOL in offered:
            accept["subprotocol"] = _SUBPROTOCOL
        held: list[Message] = []
        if model is not None:
            try:
                up, replica = await open_upstream(runtime, model, request_id, query)
            except GatewayError as err:
                self._count(model, _refusal(err))
                await _refuse(scope, send, err, request_id)
                return
            await send(accept)
        else:
            await send(accept)
            created = _event(
                "session.created", id=f"sess-{uuid.uuid4().hex}", created=int(time.time())
            )
            await send(created)
            named = await self._await_model(receive, send, held)
            if isinstance(named, Ending):
                self._count(None, named.outcome)
                await _close(send, named)
                return
            model = named
            try:
                up, replica = await open_upstream(runtime, model, request_id, query)
            except GatewayError as err:
                self._count(model, _refusal(err))
                code = _TRY_LATER if isinstance(err, NoHealthyReplica) else BAD_GATEWAY
                await _close(send, Ending("", code, err.message, 1000))
                return
        await self._relay(up, replica, model, receive, send, held, started, request_id)

    async def _relay(
        self,
        up: Upstream,
        replica: str,
        model: str,
        receive: Receive,
        send: Send,
        held: list[Message],
        started: float,
        request_id: str,
    ) -> None:
        cfg = self._runtime.config.server
        try:
            async with asyncio.timeout(cfg.send_timeout_s):
                for msg in held:
                    text = msg.get("text")
                    if text is not None:
                        await up.ws.send_str(text)
                    else:
                        await up.ws.send_bytes(msg.get("bytes") or b"")
            ending = await relay(
                up,
                receive,
                send,
                cfg.realtime_idle_timeout_s,
                cfg.send_timeout_s,
                skip_created=bool(held),
            )
        except (TimeoutError, OSError):
            ending = Ending("upstream_error", BAD_GATEWAY, "The model server is not reading.", 1001)
        except BaseException:
            # Cancelled (shutdown) or a bug: the replica's socket goes now, then the lease.
            try:
                await _close_upstream(up, 1001)
            finally:
                up.lease.release(None)
            raise
        try:
            await _close_upstream(up, ending.upstream_code)
        finally:
            # Counted in flight until the replica's socket is closed; a broken one failed.
            up.lease.release(ending.outcome != "upstream_error")
        await _close(send, ending)
        self._count(model, ending.outcome)
        log.info(
            "realtime session %s: model %s on %s ended (%s) after %.1f s",
            request_id,
            model,
            replica,
            ending.outcome,
            time.perf_counter() - started,
        )

    async def _await_model(self, receive: Receive, send: Send, held: list[Message]) -> str | Ending:
        """The model of the client's first usable session.update; `held`: the frames before."""
        cfg = self._runtime.config.server
        held_bytes = 0
        known = self._runtime.pool.known_models
        while True:
            try:
                async with asyncio.timeout(cfg.realtime_idle_timeout_s):
                    msg = await receive()
            except TimeoutError:
                why = f"No session.update for {cfg.realtime_idle_timeout_s:g} s."
                return Ending("idle_timeout", 1001, why, 1001)
            if msg["type"] == "websocket.disconnect":
                return Ending("client_closed", None, "", 1001)
            text: str | None = msg.get("text")
            data: bytes | None = msg.get("bytes")
            held_bytes += len(text) if text is not None else len(data or b"")
            if held_bytes > cfg.realtime_max_message_bytes:
                return Ending(
                    "message_too_big", TOO_BIG, "Too much sent before session.update.", 1001
                )
            event = _json(text) if text is not None else None
            if event is None or event.get("type") != "session.update":
                held.append(msg)  # the replica answers it, in order, once it is chosen
                continue
            model = event.get("model")
            # vLLM's answers to a session.update it cannot take (the connection stays open).
            if model is None:
                await send(_error("Missing required field: model", "invalid_event"))
            elif not isinstance(model, str) or model not in known():
                message = f"The model `{echo(str(model))}` does not exist."
                await send(_error(message, "model_not_found"))
            else:
                held.append(msg)
                return model

    def _count(self, model: str | None, outcome: str) -> None:
        if model is None or model not in self._runtime.pool.known_models():
            model = _UNKNOWN_MODEL
        self._runtime.metrics.realtime_session(model, outcome)


def _json(text: str) -> dict[str, Any] | None:
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _query_model(query: str) -> str | None:
    values = parse_qs(query).get("model")
    return values[0] if values and values[0] else None


def _credentials(
    headers: list[tuple[bytes, bytes]], offered: list[str]
) -> list[tuple[bytes, bytes]]:
    """The upgrade's key headers, or a browser's key subprotocol as a Bearer header."""
    found = [(k, v) for k, v in headers if k in (b"authorization", b"x-api-key")]
    if found:
        return found
    for proto in offered:
        if proto.startswith(_KEY_PROTOCOL):
            return [(b"authorization", b"Bearer " + proto[len(_KEY_PROTOCOL) :].encode())]
    return []


def _refusal(err: GatewayError) -> str:
    if isinstance(err, ModelNotFound):
        return "model_not_found"
    if isinstance(err, RealtimeUnsupported):
        return "upstream_refused"
    if isinstance(err, UpstreamFailed):
        return "upstream_unreachable"
    return {401: "unauthorized", 503: "no_replica"}.get(err.status, "gateway_error")


async def _refuse(scope: Scope, send: Send, err: GatewayError, request_id: str) -> None:
    """An HTTP error before the upgrade (vLLM's body), where the server offers one."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": reason(err.message)})
        return
    body = err.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if err.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, round(err.retry_after_s))).encode()))
    await send({"type": "websocket.http.response.start", "status": err.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


async def _close(send: Send, ending: Ending) -> None:
    """Close the client's side with the ending's code, unless it is gone already."""
    if ending.client_code is None:
        return
    message = {"type": "websocket.close", "code": ending.client_code}
    message["reason"] = reason(ending.client_reason)
    with contextlib.suppress(OSError):  # it left first (uvicorn's ClientDisconnected)
        await send(message)


async def _close_upstream(up: Upstream, code: int) -> None:
    if up.ws.closed:
        return
    with contextlib.suppress(OSError, TimeoutError):  # gone: nothing left to tell it
        await up.ws.close(code=code)
