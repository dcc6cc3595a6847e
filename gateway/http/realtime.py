"""/v1/realtime: vLLM's realtime transcription WebSocket, relayed to one replica of its model.

vLLM names the model in-band: the client connects, reads session.created, then sends
session.update {"model": ...} (vllm/entrypoints/speech_to_text/realtime/connection.py). A
client naming it in the URL as OpenAI's SDK does (`?model=`) is routed before the upgrade,
and refused with an HTTP error in vLLM's shape. Any other gets the gateway's session.created
(the replica's own is dropped later) and its frames are held, in order, until a
session.update names a model the fleet serves; then the replica's socket opens and the held
frames go first. Keys: `Authorization: Bearer` or `x-api-key` on the upgrade, or, from a
browser (which cannot set headers), OpenAI's `openai-insecure-api-key.<key>` subprotocol.

A session goes through the pipeline's stages (realtime_stages.py): its tenant's quota and
class at the upgrade, its model's version once named, the admission queue before its replica
(realtime_upstream.py), a trace and a request-log record when it ends. A draining gateway
refuses new sessions (503) and closes open ones with 1012 when the drain period ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.types import Message, Receive, Scope, Send

from gateway.errors import GatewayError, ModelNotFound, NoHealthyReplica, UpstreamFailed
from gateway.http.hot_io import request_id_of
from gateway.http.realtime_stages import SWITCHED, Session, SessionStages
from gateway.http.realtime_upstream import (
    BAD_GATEWAY,
    Ending,
    Flow,
    RealtimeUnsupported,
    Upstream,
    close_upstream,
    open_upstream,
    reason,
    relay,
)
from gateway.http.realtime_waits import (
    TRY_LATER,
    await_model,
    event,
    open_watched,
    renamer,
    with_model,
)
from gateway.runtime import Runtime
from routing.types import Decision

log = logging.getLogger("llm_gateway.realtime")

_KEY_PROTOCOL = "openai-insecure-api-key."
# The subprotocol OpenAI's browser clients offer beside the key; chosen back when offered.
_SUBPROTOCOL = "realtime"
_UNKNOWN_MODEL = "_unknown"


class RealtimeRelay:
    """The ASGI app of /v1/realtime: authenticate, admit, route, relay, count."""

    def __init__(
        self, runtime: Runtime, authorize: Callable[[list[tuple[bytes, bytes]]], str]
    ) -> None:
        self._runtime = runtime
        self._authorize = authorize
        self._stages = SessionStages(runtime)
        self._open = 0
        self._rid_header = runtime.config.server.request_id_header.lower().encode()
        # Set when the drain period ends: every open session closes with 1012 then.
        self._stop = asyncio.Event()
        runtime.stream_cutters.append(self._stop.set)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        started = time.perf_counter()
        runtime = self._runtime
        cfg = runtime.config.server
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        request_id = request_id_of(headers, self._rid_header)
        offered: list[str] = list(scope.get("subprotocols", ()))
        query = scope.get("query_string", b"").decode("latin-1")
        model = _query_model(query)
        session: Session | None = None
        try:
            tenant = self._authorize(_credentials(headers, offered))
            if runtime.draining:
                raise NoHealthyReplica("The gateway is shutting down.")
            if self._open >= cfg.realtime_max_sessions:
                raise NoHealthyReplica("Too many realtime sessions are open; try again later.")
            client = scope.get("client")
            peer = client[0] if client else None
            session = self._stages.begin(headers, tenant, peer, request_id, started)
            # The tenant's slot, held until the session ends: refused before the upgrade.
            await self._stages.reserve(session)
        except GatewayError as err:
            self._count(model, _refusal(err))
            if session is not None:
                self._stages.end(session, err.status, _refusal(err), None)
            await _refuse(scope, send, err, request_id)
            return
        self._open += 1
        try:
            await self._session(scope, receive, send, session, offered, query, model)
        finally:
            self._open -= 1
            self._stages.end(session, 499, "cancelled", None)  # unless it ended already

    async def _session(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: Session,
        offered: list[str],
        query: str,
        model: str | None,
    ) -> None:
        runtime, stages = self._runtime, self._stages
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        accept: Message = {"type": "websocket.accept"}
        if _SUBPROTOCOL in offered:
            accept["subprotocol"] = _SUBPROTOCOL
        held: list[Message] = []
        cfg = runtime.config.server
        if model is not None:
            try:
                served = stages.bind_model(session, model, headers)
                query = with_model(query, served)
                opened = await self._open_watched(session, query, receive, held)
                if isinstance(opened, Ending) and opened.outcome == "drained":
                    raise NoHealthyReplica("The gateway is shutting down.")
            except GatewayError as err:
                self._count(session.model or model, _refusal(err))
                stages.end(session, err.status, _refusal(err), None)
                await _refuse(scope, send, err, session.request_id)
                return
            if not isinstance(opened, Ending):
                await send(accept)
        else:
            await send(accept)
            await send(
                event("session.created", id=f"sess-{uuid.uuid4().hex}", created=int(time.time()))
            )
            bind = functools.partial(stages.bind_model, session, headers=headers)
            named = await await_model(receive, send, held, bind, cfg, self._stop)
            if isinstance(named, Ending):
                self._count(session.model or None, named.outcome)
                stages.end(session, SWITCHED, named.outcome, named.client_code)
                await _close(send, named)
                return
            model = named
            try:
                opened = await self._open_watched(session, query, receive, held)
            except GatewayError as err:
                self._count(session.model, _refusal(err))
                code = TRY_LATER if err.status in (429, 503) else BAD_GATEWAY
                stages.end(session, SWITCHED, _refusal(err), code)
                await _close(send, Ending("", code, err.message, 1000))
                return
        if isinstance(opened, Ending):  # the client left (or sent too much) while it waited
            self._count(session.model, opened.outcome)
            stages.end(session, SWITCHED, opened.outcome, opened.client_code)
            await _close(send, opened)
            return
        up, decision = opened
        session.replica, session.branch = decision.replica.name, decision.branch
        await self._relay(up, session, receive, send, held, renamer(model, session.model))

    async def _open_watched(
        self, session: Session, query: str, receive: Receive, held: list[Message]
    ) -> tuple[Upstream, Decision] | Ending:
        """The replica's socket, opened while the client is watched (see open_watched)."""
        opening = open_upstream(self._runtime, session.features, query, session.trace)
        limit = self._runtime.config.server.realtime_max_message_bytes
        return await open_watched(opening, receive, held, limit, self._release, self._stop)

    def _release(self, up: Upstream) -> None:
        self._runtime.pipeline.release(up.lease, None)

    async def _relay(
        self,
        up: Upstream,
        session: Session,
        receive: Receive,
        send: Send,
        held: list[Message],
        rename: Callable[[str], str],
    ) -> None:
        cfg = self._runtime.config.server
        pipeline = self._runtime.pipeline
        flow = Flow(session.tally, rename, self._stop)
        try:
            async with asyncio.timeout(cfg.send_timeout_s):
                for msg in held:
                    session.tally.frames_in += 1
                    text = msg.get("text")
                    if text is not None:
                        await up.ws.send_str(rename(text))
                    else:
                        await up.ws.send_bytes(msg.get("bytes") or b"")
            ending = await relay(
                up,
                receive,
                send,
                cfg.realtime_idle_timeout_s,
                cfg.send_timeout_s,
                skip_created=bool(held),
                flow=flow,
            )
        except (TimeoutError, OSError):
            ending = Ending("upstream_error", BAD_GATEWAY, "The model server is not reading.", 1001)
        except BaseException:
            # Cancelled (shutdown) or a bug: the replica's socket goes now, then the lease.
            try:
                await close_upstream(up, 1001)
            finally:
                pipeline.release(up.lease, None)
            raise
        try:
            await close_upstream(up, ending.upstream_code)
        finally:
            # Counted in flight until the replica's socket is closed; a broken one failed.
            pipeline.release(up.lease, ending.outcome != "upstream_error")
        await _close(send, ending)
        self._count(session.model, ending.outcome)
        self._stages.end(session, SWITCHED, ending.outcome, ending.client_code)
        log.info(
            "realtime session %s: model %s on %s ended (%s) after %.1f s",
            session.request_id,
            session.model,
            session.replica,
            ending.outcome,
            time.perf_counter() - session.started,
        )

    def _count(self, model: str | None, outcome: str) -> None:
        if model is None or model not in self._runtime.pool.known_models():
            model = _UNKNOWN_MODEL
        self._runtime.metrics.realtime_session(model, outcome)


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
    # 429: over the tenant's quota, or the admission queue full or waited out.
    codes = {400: "bad_request", 401: "unauthorized", 429: "rate_limited", 503: "no_replica"}
    return codes.get(err.status, "gateway_error")


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
