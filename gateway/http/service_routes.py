"""The gateway's own Starlette routes besides the proxied ones: health, readiness, models,
metrics, and the error answers of every Starlette route."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, InternalError, NoHealthyReplica, Unauthorized
from gateway.http.hot_io import error_response
from gateway.proxy.identity import ApiKeys
from gateway.runtime import Runtime
from telemetry.metrics import CONTENT_TYPE
from vllm_api.errors import error_body


class ServiceRoutes:
    """Handlers of the Starlette routes that are neither proxied nor admin."""

    def __init__(
        self,
        runtime: Runtime,
        admin_keys: ApiKeys,
        authorize: Callable[[list[tuple[bytes, bytes]]], str],
    ) -> None:
        self.runtime = runtime
        self._admin_keys = admin_keys  # replaced in place by a reload
        self._authorize = authorize

    async def health(self, _request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, _request: Request) -> Response:
        if self.runtime.draining or not self.runtime.pool.ready():
            err = NoHealthyReplica("No replica is ready.")
            return error_response(err)
        return Response(b'{"status":"ready"}', media_type="application/json")

    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request.headers.raw)
        except GatewayError as err:
            return error_response(err)
        cards = self.runtime.pool.model_cards()
        body = orjson.dumps({"object": "list", "data": cards})
        return Response(body, media_type="application/json")

    async def metrics(self, request: Request) -> Response:
        # Replica names, health and load: behind the admin keys once there are any.
        if self._admin_keys.enabled and not self._admin_keys.in_headers(request.headers.raw):
            return error_response(Unauthorized("Invalid or missing admin key."))
        return Response(self.runtime.metrics.render(), media_type=CONTENT_TYPE)

    async def method_not_allowed(self, _request: Request) -> Response:
        raise HTTPException(status_code=405)

    async def internal_error(self, _request: Request, _exc: Exception) -> Response:
        # Starlette re-raises once this answer is out, so the server still logs the traceback.
        return error_response(InternalError())

    async def http_error(self, _request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        messages = {404: "Not Found", 405: "Method Not Allowed"}
        body = error_body(messages.get(exc.status_code, exc.detail), exc.status_code)
        return Response(body, status_code=exc.status_code, media_type="application/json")
