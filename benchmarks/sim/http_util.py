"""What every route module of a simulated replica shares: the app key and JSON responses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from benchmarks.sim import protocol as P

if TYPE_CHECKING:
    from benchmarks.sim.replica import Replica

REPLICA: web.AppKey[Replica] = web.AppKey("sim_replica")
JSON = "application/json"


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=JSON)


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    body = P.error_body(status, message, P.error_type(status), param)
    return web.Response(body=body, status=status, content_type=JSON)


def api_error_response(exc: P.ApiError) -> web.Response:
    return web.Response(body=exc.body(), status=exc.status, content_type=JSON)


def replica_of(request: web.Request) -> Replica:
    return request.app[REPLICA]
