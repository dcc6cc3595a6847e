"""The HTTP front end: a raw-ASGI hot path for completions, Starlette for everything else."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.admin.routes import AdminApi
from gateway.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    InternalError,
    NoHealthyReplica,
    Unauthorized,
)
from gateway.http.hot_io import (
    ClientGone,
    Cycle,
    error_response,
    read_body,
    request_id_of,
    send_error,
)
from gateway.http.realtime import RealtimeRelay
from gateway.http.realtime_upstream import PATH as REALTIME_PATH
from gateway.http.routes import HOT_PATHS, hot_route
from gateway.http.service_routes import ServiceRoutes
from gateway.http.transport import DISCONNECT_EXTENSION
from gateway.http.upstream_errors import relay_error
from gateway.proxy import hints, responses_route
from gateway.proxy.headers import ForwardPolicy, FrontHeaders, client_response_headers
from gateway.proxy.identity import ApiKeys, is_loopback
from gateway.proxy.pooling_route import unsupported_message
from gateway.proxy.requests import (
    ANTHROPIC_KINDS,
    AUDIO_KINDS,
    POOLING_KINDS,
    Kind,
    ParsedRequest,
    parse_request,
    stored_request,
)
from gateway.proxy.upstream import Exchange, StreamBroken
from gateway.replicas.gpu import apply_heartbeat
from gateway.runtime import Runtime
from routing.types import Branch
from vllm_api.anthropic import stream_error_event
from vllm_api.errors import error_body
from vllm_api.sse import error_event

log = logging.getLogger("llm_gateway.http")


# A worker heartbeat is a few small numbers: anything larger is refused while it arrives.
_HEARTBEAT_LIMIT = 65536
# The model label of a request refused before its model was read (or of an unknown model).
_UNKNOWN_MODEL = "_unknown"


class GatewayApp:
    """The ASGI application of one gateway process."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._open: dict[asyncio.Task[Any], Cycle] = {}
        runtime.stream_cutters.append(self._cut_streams)
        cfg = runtime.config.server
        self._limit = cfg.max_body_bytes
        self._audio_limit = cfg.max_audio_body_bytes
        self._receive_timeout = cfg.request_receive_timeout_s
        self._rid_header = cfg.request_id_header.lower().encode()
        # Data-plane keys ([server].api_keys and tenants' keys), trusted tenant headers.
        self._tenancy = runtime.tenancy
        self._admin_keys: ApiKeys = runtime.admin_keys  # replaced in place by a reload
        self._forward = ForwardPolicy(cfg.forward_headers, cfg.trusted_proxies)
        own = ServiceRoutes(runtime, self._admin_keys, self._authorize)
        routes = [
            Route("/health", own.health, methods=["GET"]),
            Route("/ready", own.ready, methods=["GET"]),
            Route("/v1/models", own.models, methods=["GET"]),
            Route("/admin/heartbeat", self._heartbeat, methods=["POST"]),
            *AdminApi(runtime, self._admin).routes(),
            *(Route(p, own.method_not_allowed, methods=["GET"]) for p in HOT_PATHS),
        ]
        if runtime.config.telemetry.metrics_enabled:
            routes.append(Route("/metrics", own.metrics, methods=["GET"]))
        self._starlette = Starlette(
            routes=routes,
            exception_handlers={HTTPException: own.http_error, Exception: own.internal_error},
        )
        # A 307 to a trailing-slash-less path would build its Location from the client's Host.
        self._starlette.router.redirect_slashes = False
        self._realtime = RealtimeRelay(runtime, self._authorize)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = hot_route(scope["method"], scope["path"])
            if route is not None:
                await self._proxy(route[0], scope, receive, send, route[1])
                return
        elif scope["type"] == "websocket" and scope["path"] == REALTIME_PATH:
            await self._realtime(scope, receive, send)
            return
        await self._starlette(scope, receive, send)

    # --- the hot path -------------------------------------------------------------------

    def _authorize(self, headers: list[tuple[bytes, bytes]]) -> str:
        """The tenant of the request's key ("default" when no keys are set); 401 without one."""
        # The Anthropic SDK sends its key as x-api-key: the same key, another header.
        return self._tenancy.identify(
            v if k == b"authorization" else b"Bearer " + v
            for k, v in headers
            if k == b"authorization" or k == b"x-api-key"
        )

    async def _proxy(
        self,
        kind: Kind,
        scope: Scope,
        receive: Receive,
        send: Send,
        response_id: str | None = None,
    ) -> None:
        started = time.perf_counter()
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        request_id = request_id_of(headers, self._rid_header)
        runtime = self.runtime
        try:
            tenant = self._authorize(headers)
            hook = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
            buffered = hook is not None and hook.body_buffered
            limit = self._audio_limit if kind in AUDIO_KINDS else self._limit
            body = await read_body(headers, receive, limit, self._receive_timeout, buffered)
            if runtime.draining:
                raise NoHealthyReplica("The gateway is shutting down.")
            found = hints.from_headers(headers)
            if response_id is not None:
                query = scope.get("query_string", b"").decode("latin-1")
                stored = stored_request(kind, response_id, request_id, query)
                parsed = hints.apply(stored, found)
            else:
                parsed = hints.apply(parse_request(kind, body, request_id), found)
            # The key's tenant, or a trusted source's x-tenant-id; the class within its bounds.
            client = scope.get("client")
            parsed = self._tenancy.bind(parsed, tenant, found, client[0] if client else None)
        except ClientGone:
            return
        except GatewayError as err:
            self._refused(err, _UNKNOWN_MODEL, started)
            await send_error(send, err, request_id, kind)
            return
        except Exception:
            # Last resort: a bug still gets vLLM's JSON body, never uvicorn's plain-text 500.
            # (CancelledError is no Exception: a client gone or a shutdown still propagates.)
            log.exception("request %s: unexpected error before routing", request_id)
            internal = InternalError()
            self._refused(internal, _UNKNOWN_MODEL, started)
            await send_error(send, internal, request_id, kind)
            return

        # From here the client may vanish at any await: a watcher cancels this task if it does,
        # which closes the upstream request and frees the replica's slot at once.
        task = asyncio.current_task()
        assert task is not None
        cycle = Cycle()

        def gone() -> None:
            if not cycle.responded:
                cycle.gone = True
                task.cancel()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone()

        # Our protocol calls back when the client goes; any other server gets a watcher task.
        hook = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
        watcher = None
        if hook is not None:
            hook.callback = gone
        else:
            watcher = asyncio.create_task(watch())
        self._open[task] = cycle
        try:
            await self._serve(parsed, self._forwarded(scope), started, send, cycle)
        except asyncio.CancelledError:
            if (cycle.gone or cycle.cut) and task.uncancel() == 0:
                if cycle.gone:
                    log.info("request %s: client disconnected", request_id)
                    return
                await self._send_cut(send, cycle, request_id)
                return
            raise
        finally:
            del self._open[task]
            if watcher is not None:
                watcher.cancel()
            elif hook is not None:
                hook.callback = None

    def _forwarded(self, scope: Scope) -> FrontHeaders:
        """The request's headers as they may go upstream (credentials, X-Forwarded-*)."""
        client = scope.get("client")
        return self._forward.apply(
            scope["headers"], client[0] if client else None, scope.get("scheme", "http")
        )

    def _refused(self, err: GatewayError, model: str, started: float) -> None:
        """Count a request the gateway answered itself, before any replica was chosen."""
        elapsed = time.perf_counter() - started
        self.runtime.metrics.request_done(model, "", err.status, Branch.NONE, elapsed)

    def _cut_streams(self) -> None:
        """Drain period over: end every open request now (its upstream is closed on the way)."""
        for task, cycle in self._open.items():
            if not cycle.responded:
                cycle.cut = True
                task.cancel()

    async def _send_cut(self, send: Send, cycle: Cycle, request_id: str) -> None:
        log.warning("request %s: cut at the end of the drain period", request_id)
        message = "The gateway is shutting down; the request was not completed."
        if cycle.started:
            event = error_event(message, 503)
            await send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            await send_error(send, NoHealthyReplica(message), request_id)

    async def _serve(
        self,
        req: ParsedRequest,
        headers: list[tuple[bytes, bytes]],
        started: float,
        send: Send,
        cycle: Cycle,
    ) -> None:
        pipeline = self.runtime.pipeline
        try:
            exchange = await pipeline.open(req, headers, started)
        except GatewayError as err:  # counted by the pipeline
            cycle.responded = True
            await send_error(send, err, req.request_id, req.kind)
            return
        except Exception:
            log.exception("request %s: unexpected error while routing", req.request_id)
            internal = InternalError()
            known = req.model in self.runtime.pool.known_models()
            self._refused(internal, req.model if known else _UNKNOWN_MODEL, started)
            cycle.responded = True
            await send_error(send, internal, req.request_id, req.kind)
            return
        ok, status = True, exchange.status
        try:
            ok = await self._relay(req, exchange, send, cycle)
        except Exception:
            ok = True  # the gateway failed, not the replica
            if cycle.started or cycle.responded:
                raise  # bytes went out: too late for an error body
            log.exception("request %s: unexpected error before responding", req.request_id)
            status = 500
            cycle.responded = True
            await send_error(send, InternalError(), req.request_id, req.kind)
        except BaseException:
            ok = True  # the client left (or shutdown): the replica did nothing wrong
            raise
        finally:
            pipeline.finish(req, exchange, status, ok and exchange.status < 500)

    async def _relay(
        self, req: ParsedRequest, exchange: Exchange, send: Send, cycle: Cycle
    ) -> bool:
        out_headers = client_response_headers(exchange.response.headers.items(), req.request_id)
        if not exchange.streaming:
            body = exchange.first
            if exchange.status >= 400:
                body, out_headers = relay_error(exchange, out_headers, req.request_id)
                mapped = body is not exchange.first
                if mapped and exchange.status == 404 and req.kind in POOLING_KINDS:
                    # FastAPI's bare 404: this replica's model has no such task.
                    name = exchange.lease.replica.name
                    body = error_body(unsupported_message(req.kind, req.model, name), 404)
            elif req.kind == "responses":
                self._remember(responses_route.body_id(body), exchange)
            out_headers.append((b"content-length", str(len(body)).encode()))
            cycle.responded = True
            await send(
                {"type": "http.response.start", "status": exchange.status, "headers": out_headers}
            )
            await send({"type": "http.response.body", "body": body})
            return True
        cycle.started = True
        await send(
            {"type": "http.response.start", "status": exchange.status, "headers": out_headers}
        )
        sniffer = responses_route.CreatedSniffer() if req.kind == "responses" else None
        try:
            async for chunk in exchange.chunks():
                if sniffer is not None and not sniffer.done:
                    self._remember(sniffer.feed(chunk), exchange)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except StreamBroken as broken:
            # Never retried once bytes went out: end with vLLM's error event and no [DONE].
            log.warning(
                "request %s: stream from %s broke: %s",
                req.request_id,
                exchange.lease.replica.name,
                broken.reason,
            )
            self.runtime.metrics.stream_truncated(req.model, exchange.lease.replica.name)
            msg = "The model server stopped streaming before the answer was complete."
            if req.kind in ANTHROPIC_KINDS:
                event = stream_error_event(msg)
            else:
                event = error_event(msg, 502)
            cycle.responded = True
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return False
        cycle.responded = True
        await send({"type": "http.response.body", "body": b""})
        return True

    def _remember(self, response_id: str | None, exchange: Exchange) -> None:
        """A response its replica may store: its follow-ups must go back there."""
        if response_id is not None:
            self.runtime.pipeline.responses.put(response_id, exchange.lease.replica.name)

    # --- everything else (the rest is in service_routes.py) ----------------------------

    def _admin(self, request: Request) -> None:
        """Admin routes: an admin key when some are set, else only a client on this host."""
        if self._admin_keys.enabled:
            if not self._admin_keys.in_headers(request.headers.raw):
                raise Unauthorized("Invalid or missing admin key.")
            return
        # No admin keys: a data-plane key must not open them, but a sidecar agent still can.
        if not is_loopback(request.client.host if request.client else None):
            raise Forbidden("Admin routes need an admin key; none is configured.")

    async def _heartbeat(self, request: Request) -> Response:
        try:
            self._admin(request)
            # Read as it arrives: a huge (or endless) post is refused at the limit, not buffered.
            body = await read_body(
                request.headers.raw, request.receive, _HEARTBEAT_LIMIT, self._receive_timeout
            )
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise BadRequest("Invalid JSON in heartbeat.") from None
            apply_heartbeat(self.runtime.pool, data)
        except ClientGone:
            return Response(status_code=400)  # nobody is left to read it
        except GatewayError as err:
            return error_response(err)
        return Response(status_code=204)
