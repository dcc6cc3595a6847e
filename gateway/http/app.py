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
    PayloadTooLarge,
    Unauthorized,
)
from gateway.http.transport import DISCONNECT_EXTENSION
from gateway.http.upstream_errors import relay_error
from gateway.proxy import hints, messages_route, responses_route
from gateway.proxy.headers import ForwardPolicy, FrontHeaders, client_response_headers
from gateway.proxy.identity import ApiKeys, is_loopback, new_request_id, request_id
from gateway.proxy.requests import (
    ANTHROPIC_KINDS,
    Kind,
    ParsedRequest,
    parse_request,
    stored_request,
)
from gateway.proxy.upstream import Exchange, StreamBroken
from gateway.replicas.gpu import apply_heartbeat
from gateway.runtime import Runtime
from routing.types import Branch
from telemetry.metrics import CONTENT_TYPE
from vllm_api.anthropic import stream_error_event
from vllm_api.errors import error_body
from vllm_api.sse import error_event

log = logging.getLogger("llm_gateway.http")


_JSON = (b"content-type", b"application/json")
_HOT_PATHS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
# A worker heartbeat is a few small numbers: anything larger is refused while it arrives.
_HEARTBEAT_LIMIT = 65536
# The Upstream seam only POSTs (gateway/proxy/upstream.py): retrieval is not relayed yet.
_NO_GET = (
    "Retrieving a stored response (GET /v1/responses/{id}) is not supported by the gateway "
    "yet; follow-ups with previous_response_id and cancel are."
)
# The model label of a request refused before its model was read (or of an unknown model).
_UNKNOWN_MODEL = "_unknown"


class _ClientGone(Exception):
    """The client disconnected while its request was being served."""


class _Cycle:
    """Per-request flags shared with the disconnect watcher."""

    __slots__ = ("cut", "gone", "responded", "started")

    def __init__(self) -> None:
        self.gone = False
        # The drain period ended while this request was open: end it, don't wait for it.
        self.cut = False
        # The status line went out (a stream): an error can only be an SSE event now.
        self.started = False
        # Set before the last send: uvicorn also reports "disconnect" once a response completes.
        self.responded = False


async def _send_error(
    send: Send, err: GatewayError, request_id: str, kind: Kind | None = None
) -> None:
    # The Anthropic SDK reads only its own error shape on its routes.
    body = messages_route.error_body(err) if kind in ANTHROPIC_KINDS else err.body()
    headers = [
        _JSON,
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if err.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, round(err.retry_after_s))).encode()))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error_response(err: GatewayError) -> Response:
    return Response(err.body(), status_code=err.status, media_type="application/json")


def _request_id(headers: list[tuple[bytes, bytes]], header: bytes) -> str:
    for k, v in headers:
        if k == header:
            return request_id(v.decode("latin-1"))
    return new_request_id()


class GatewayApp:
    """The ASGI application of one gateway process."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._open: dict[asyncio.Task[Any], _Cycle] = {}
        runtime.stream_cutters.append(self._cut_streams)
        cfg = runtime.config.server
        self._limit = cfg.max_body_bytes
        self._receive_timeout = cfg.request_receive_timeout_s
        self._rid_header = cfg.request_id_header.lower().encode()
        # Data-plane keys ([server].api_keys and tenants' keys), trusted tenant headers.
        self._tenancy = runtime.tenancy
        self._admin_keys: ApiKeys = runtime.admin_keys  # replaced in place by a reload
        self._forward = ForwardPolicy(cfg.forward_headers, cfg.trusted_proxies)
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/ready", self._ready, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/admin/heartbeat", self._heartbeat, methods=["POST"]),
            *AdminApi(runtime, self._admin).routes(),
            *(Route(p, self._method_not_allowed, methods=["GET"]) for p in _HOT_PATHS),
        ]
        if runtime.config.telemetry.metrics_enabled:
            routes.append(Route("/metrics", self._metrics, methods=["GET"]))
        self._starlette = Starlette(
            routes=routes,
            exception_handlers={HTTPException: self._http_error, Exception: self._internal_error},
        )
        # A 307 to a trailing-slash-less path would build its Location from the client's Host.
        self._starlette.router.redirect_slashes = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            kind = _HOT_PATHS.get(scope["path"])
            if kind is not None and scope["method"] == "POST":
                await self._proxy(kind, scope, receive, send)
                return
            stored = responses_route.stored_route(scope["method"], scope["path"])
            if stored is not None:
                await self._proxy(stored[0], scope, receive, send, stored[1])
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

    async def _read_body(
        self,
        headers: list[tuple[bytes, bytes]],
        receive: Receive,
        limit: int,
        buffered: bool = False,
    ) -> bytes:
        """The whole body, refused (413) as soon as it passes `limit` bytes, within a deadline."""
        for k, v in headers:
            if k == b"content-length":
                if not v.isdigit():
                    raise BadRequest("Invalid Content-Length header.")
                if int(v) > limit:
                    raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
        chunks: list[bytes] = []
        size = 0
        if buffered:
            # All of it arrived with the head (the protocol says so): no deadline to arm.
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            body: bytes = message.get("body", b"")
            if len(body) > limit:
                raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
            if not message.get("more_body", False):
                return body
            chunks.append(body)
            size = len(body)
        try:
            async with asyncio.timeout(self._receive_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise GatewayError("Request body not received in time.", status=408) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

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
        request_id = _request_id(headers, self._rid_header)
        runtime = self.runtime
        try:
            tenant = self._authorize(headers)
            hook = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
            buffered = hook is not None and hook.body_buffered
            body = await self._read_body(headers, receive, self._limit, buffered)
            if runtime.draining:
                raise NoHealthyReplica("The gateway is shutting down.")
            found = hints.from_headers(headers)
            if response_id is not None:
                if kind == "response_get":
                    raise GatewayError(_NO_GET, status=501)
                parsed = hints.apply(stored_request(kind, response_id, request_id), found)
            else:
                parsed = hints.apply(parse_request(kind, body, request_id), found)
            # The key's tenant, or a trusted source's x-tenant-id; the class within its bounds.
            client = scope.get("client")
            parsed = self._tenancy.bind(parsed, tenant, found, client[0] if client else None)
        except _ClientGone:
            return
        except GatewayError as err:
            self._refused(err, _UNKNOWN_MODEL, started)
            await _send_error(send, err, request_id, kind)
            return
        except Exception:
            # Last resort: a bug still gets vLLM's JSON body, never uvicorn's plain-text 500.
            # (CancelledError is no Exception: a client gone or a shutdown still propagates.)
            log.exception("request %s: unexpected error before routing", request_id)
            internal = InternalError()
            self._refused(internal, _UNKNOWN_MODEL, started)
            await _send_error(send, internal, request_id, kind)
            return

        # From here the client may vanish at any await: a watcher cancels this task if it does,
        # which closes the upstream request and frees the replica's slot at once.
        task = asyncio.current_task()
        assert task is not None
        cycle = _Cycle()

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

    async def _send_cut(self, send: Send, cycle: _Cycle, request_id: str) -> None:
        log.warning("request %s: cut at the end of the drain period", request_id)
        message = "The gateway is shutting down; the request was not completed."
        if cycle.started:
            event = error_event(message, 503)
            await send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            await _send_error(send, NoHealthyReplica(message), request_id)

    async def _serve(
        self,
        req: ParsedRequest,
        headers: list[tuple[bytes, bytes]],
        started: float,
        send: Send,
        cycle: _Cycle,
    ) -> None:
        pipeline = self.runtime.pipeline
        try:
            exchange = await pipeline.open(req, headers, started)
        except GatewayError as err:  # counted by the pipeline
            cycle.responded = True
            await _send_error(send, err, req.request_id, req.kind)
            return
        except Exception:
            log.exception("request %s: unexpected error while routing", req.request_id)
            internal = InternalError()
            known = req.model in self.runtime.pool.known_models()
            self._refused(internal, req.model if known else _UNKNOWN_MODEL, started)
            cycle.responded = True
            await _send_error(send, internal, req.request_id, req.kind)
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
            await _send_error(send, InternalError(), req.request_id, req.kind)
        except BaseException:
            ok = True  # the client left (or shutdown): the replica did nothing wrong
            raise
        finally:
            pipeline.finish(req, exchange, status, ok and exchange.status < 500)

    async def _relay(
        self, req: ParsedRequest, exchange: Exchange, send: Send, cycle: _Cycle
    ) -> bool:
        out_headers = client_response_headers(exchange.response.headers.items(), req.request_id)
        if not exchange.streaming:
            body = exchange.first
            if exchange.status >= 400:
                body, out_headers = relay_error(exchange, out_headers, req.request_id)
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

    # --- everything else ----------------------------------------------------------------

    async def _health(self, _request: Request) -> Response:
        return Response(status_code=200)

    async def _ready(self, _request: Request) -> Response:
        if self.runtime.draining or not self.runtime.pool.ready():
            err = NoHealthyReplica("No replica is ready.")
            return _error_response(err)
        return Response(b'{"status":"ready"}', media_type="application/json")

    def _admin(self, request: Request) -> None:
        """Admin routes: an admin key when some are set, else only a client on this host."""
        if self._admin_keys.enabled:
            if not self._admin_keys.in_headers(request.headers.raw):
                raise Unauthorized("Invalid or missing admin key.")
            return
        # No admin keys: a data-plane key must not open them, but a sidecar agent still can.
        if not is_loopback(request.client.host if request.client else None):
            raise Forbidden("Admin routes need an admin key; none is configured.")

    async def _models(self, request: Request) -> Response:
        try:
            self._authorize(request.headers.raw)
        except GatewayError as err:
            return _error_response(err)
        body = orjson.dumps({"object": "list", "data": self.runtime.pool.model_cards()})
        return Response(body, media_type="application/json")

    async def _heartbeat(self, request: Request) -> Response:
        try:
            self._admin(request)
            # Read as it arrives: a huge (or endless) post is refused at the limit, not buffered.
            body = await self._read_body(request.headers.raw, request.receive, _HEARTBEAT_LIMIT)
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise BadRequest("Invalid JSON in heartbeat.") from None
            apply_heartbeat(self.runtime.pool, data)
        except _ClientGone:
            return Response(status_code=400)  # nobody is left to read it
        except GatewayError as err:
            return _error_response(err)
        return Response(status_code=204)

    async def _metrics(self, request: Request) -> Response:
        # Replica names, health and load: behind the admin keys once there are any.
        if self._admin_keys.enabled and not self._admin_keys.in_headers(request.headers.raw):
            return _error_response(Unauthorized("Invalid or missing admin key."))
        return Response(self.runtime.metrics.render(), media_type=CONTENT_TYPE)

    async def _method_not_allowed(self, _request: Request) -> Response:
        raise HTTPException(status_code=405)

    async def _internal_error(self, _request: Request, _exc: Exception) -> Response:
        # Starlette re-raises once this answer is out, so the server still logs the traceback.
        return _error_response(InternalError())

    async def _http_error(self, _request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        messages = {404: "Not Found", 405: "Method Not Allowed"}
        body = error_body(messages.get(exc.status_code, exc.detail), exc.status_code)
        return Response(body, status_code=exc.status_code, media_type="application/json")
