"""What every route module of a simulated replica shares: the app key and JSON responses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from simulator import protocol as P
from vllm_api.errors import error_body

if TYPE_CHECKING:
    from simulator.replica import Replica

REPLICA: web.AppKey[Replica] = web.AppKey("sim_replica")
JSON = "application/json"


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=JSON)


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    body = error_body(message, status, param)
    return web.Response(body=body, status=status, content_type=JSON)


def api_error_response(exc: P.ApiError) -> web.Response:
    return web.Response(body=exc.body(), status=exc.status, content_type=JSON)


def replica_of(request: web.Request) -> Replica:
    return request.app[REPLICA]
