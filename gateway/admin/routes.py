"""The admin API under /admin/: the fleet's live state, fleet changes and reload, as JSON.

Every route is authorised as `/admin/heartbeat` is (the admin keys; without any, loopback
clients only); data-plane keys never open them. Errors keep vLLM's error shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin.changes import Change
from gateway.admin.dashboard import dashboard_response
from gateway.admin.dashboard_summary import summary
from gateway.admin.fleet import FleetError, parse_replica
from gateway.admin.reload import reload_from_file
from gateway.admin.views import fleet_view
from gateway.config_loader import ConfigError
from gateway.errors import BadRequest, GatewayError, PayloadTooLarge, Unauthorized

if TYPE_CHECKING:
    from gateway.runtime import Runtime

# A replica's table is small: anything larger is refused while it arrives.
_BODY_LIMIT = 65536
_BODY_TIMEOUT_S = 10.0

Handler = Callable[[Request], Awaitable[Response]]


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _error(err: GatewayError) -> Response:
    return Response(err.body(), status_code=err.status, media_type="application/json")


async def _body(request: Request) -> Any:
    """The request's JSON body (empty: {}), bounded in size and time."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(_BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > _BODY_LIMIT:
                    raise PayloadTooLarge(f"Admin request body exceeds {_BODY_LIMIT} bytes.")
                chunks.append(chunk)
    except TimeoutError:
        raise GatewayError("Request body not received in time.", status=408) from None
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("Invalid JSON body.") from None


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("1", "true", "yes")


async def _to_dashboard(_request: Request) -> Response:
    return Response(status_code=307, headers={"location": "/admin/dashboard"})


class AdminApi:
    """The handlers, over one runtime; `authorize` raises a GatewayError to refuse a caller."""

    def __init__(self, runtime: Runtime, authorize: Callable[[Request], None]) -> None:
        self._runtime = runtime
        self._authorize = authorize

    def routes(self) -> list[Route]:
        return [
            Route("/admin/replicas", self._guard(self._list), methods=["GET"]),
            Route("/admin/replicas", self._guard(self._add), methods=["POST"]),
            Route("/admin/replicas/{name}", self._guard(self._remove), methods=["DELETE"]),
            Route("/admin/replicas/{name}/drain", self._guard(self._drain), methods=["POST"]),
            Route("/admin/replicas/{name}/undrain", self._guard(self._undrain), methods=["POST"]),
            Route("/admin/reload", self._guard(self._reload), methods=["POST"]),
            Route("/admin/summary", self._guard(self._summary), methods=["GET"]),
            Route("/admin/dashboard", self._dashboard, methods=["GET"]),
            # Relative: a Location built from the client's Host could point anywhere.
            Route("/dashboard", _to_dashboard, methods=["GET"]),
        ]

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            try:
                self._authorize(request)
                return await handler(request)
            except FleetError as exc:
                return _error(GatewayError(exc.message, status=exc.status))
            except ConfigError as exc:
                return _error(BadRequest(str(exc)))
            except GatewayError as err:
                return _error(err)

        return guarded

    def _view(self, name: str) -> dict[str, Any]:
        return next(v for v in self._fleet_view() if v["name"] == name)

    def _fleet_view(self) -> list[dict[str, Any]]:
        return fleet_view(self._runtime.pool, self._runtime.fleet.origins)

    async def _list(self, _request: Request) -> Response:
        return _json({"replicas": self._fleet_view()})

    async def _add(self, request: Request) -> Response:
        data = await _body(request)
        if not isinstance(data, dict):
            raise BadRequest("The body must be a JSON object: a [[replicas]] table.")
        cfg = parse_replica(data)
        replica = await self._runtime.fleet.add(cfg, "admin")
        added = {"added": self._view(replica.name)}
        return await self._spread(Change("add", replica=data), added, 201)

    async def _remove(self, request: Request) -> Response:
        name = request.path_params["name"]
        wait = request.query_params.get("timeout_s")
        try:
            wait_s = None if wait is None else float(wait)
        except ValueError:
            raise BadRequest("timeout_s must be a number of seconds.") from None
        if wait_s is not None and wait_s < 0:
            raise BadRequest("timeout_s must be >= 0.")
        force = _flag(request, "force")
        removal = await self._runtime.fleet.remove(name, force, wait_s)
        if not removal.removed:  # kept drained here: a refusal, not passed on
            return _json(removal.as_dict(), 409)
        change = Change("remove", name, force=force, wait_s=wait_s)
        return await self._spread(change, removal.as_dict())

    async def _drain(self, request: Request) -> Response:
        name = request.path_params["name"]
        changed = self._runtime.fleet.drain(name)
        answer = {"changed": changed, "replica": self._view(name)}
        return await self._spread(Change("drain", name), answer)

    async def _undrain(self, request: Request) -> Response:
        name = request.path_params["name"]
        changed = self._runtime.fleet.undrain(name)
        answer = {"changed": changed, "replica": self._view(name)}
        return await self._spread(Change("undrain", name), answer)

    async def _summary(self, _request: Request) -> Response:
        return _json(summary(self._runtime, self._fleet_view()))

    async def _dashboard(self, request: Request) -> Response:
        # A browser's navigation cannot send the key: the page (no data in it) asks for it.
        try:
            self._authorize(request)
        except Unauthorized:
            pass
        except GatewayError as err:
            return _error(err)
        return dashboard_response(self._runtime.admin_keys.enabled)

    async def _reload(self, _request: Request) -> Response:
        result = await reload_from_file(self._runtime)
        return await self._spread(Change("reload"), result.as_dict())

    async def _spread(self, change: Change, body: dict[str, Any], status: int = 200) -> Response:
        """Applied here: hand `change` to every sibling worker, say how each took it (`workers`)."""
        spread = self._runtime.fleet.spread
        if spread is not None:  # one of --workers (gateway/workers.py)
            body["workers"] = await spread(change)
        return _json(body, status)
