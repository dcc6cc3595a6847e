"""A replica's routes besides generation: models, health, metrics, tokenizer, admin (/_sim)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from simulator import protocol as P
from simulator.config import SimError
from simulator.http_util import (
    api_error_response,
    error_response,
    json_response,
    replica_of,
)
from vllm_api.errors import VllmApiError


async def models(request: web.Request) -> web.Response:
    rep = replica_of(request)
    base = rep.served[0]

    def card(mid: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
        perm = {"id": f"modelperm-{rep.name}", "object": "model_permission",
                "created": rep.created, "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False}  # fmt: skip
        return {"id": mid, "object": "model", "created": rep.created, "owned_by": "vllm",
                "root": mid if parent is None else f"/loras/{mid}", "parent": parent,
                "max_model_len": max_len, "permission": [perm]}  # fmt: skip

    data = [card(base, None, rep.config.max_model_len)]
    data += [card(name, base, None) for name in rep.served[1:]]
    return json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if replica_of(request).healthy() else 503)


async def ping(request: web.Request) -> web.Response:
    return web.Response(status=200 if replica_of(request).healthy() else 503)


async def load(request: web.Request) -> web.Response:
    rep = replica_of(request)
    if rep.faults.load_absent:
        return json_response({"detail": "Not Found"}, status=404)  # FastAPI's unknown route
    return json_response({"server_load": 0 if rep.faults.load_untracked else rep.inflight})


async def version(request: web.Request) -> web.Response:
    from simulator.replica import VLLM_VERSION

    return json_response({"version": VLLM_VERSION})


async def metrics(request: web.Request) -> web.Response:
    body = await replica_of(request).serve_metrics()
    return web.Response(
        body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


async def tokenize(request: web.Request) -> web.Response:
    rep = replica_of(request)
    try:
        body = P.parse_body(await request.read())
        if isinstance(body.get("messages"), list):
            gen = body.get("add_generation_prompt", True) is not False
            ids = rep.encode_prompt(rep.template.render(body["messages"], gen), chat=True)
        elif isinstance(body.get("prompt"), str):
            ids = rep.encode_prompt(body["prompt"], chat=False)
        else:
            raise P.invalid("prompt (string) or messages (list) is required")
    except P.ApiError as exc:
        return api_error_response(exc)
    except (SimError, VllmApiError) as exc:
        return error_response(400, str(exc))
    strs = None
    if body.get("return_token_strs") is True:
        # The Tokenizer protocol has no id -> piece lookup: a one-token decode stands in for it.
        strs = [rep.tokenizer.decode([t]) for t in ids]
    return json_response({"count": len(ids), "max_model_len": rep.config.max_model_len,
                  "tokens": ids, "token_strs": strs})  # fmt: skip


async def detokenize(request: web.Request) -> web.Response:
    rep = replica_of(request)
    try:
        body = P.parse_body(await request.read())
    except P.ApiError as exc:
        return api_error_response(exc)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return error_response(400, "tokens must be a list of ints", "tokens")
    return json_response({"prompt": rep.tokenizer.decode(tokens)})


async def kv_event_sources(request: web.Request) -> web.Response:
    rep = replica_of(request)
    if rep.publisher is None:
        return json_response({})
    return json_response({"0": {"enable_kv_cache_events": True, "publisher": "zmq",
                        "endpoint": rep.kv_events_endpoint, "topic": rep.config.kv_events_topic,
                        "replay_endpoint": rep.replay_endpoint}})  # fmt: skip


async def get_faults(request: web.Request) -> web.Response:
    return json_response(replica_of(request).faults.to_json())


async def post_faults(request: web.Request) -> web.Response:
    rep = replica_of(request)
    try:
        patch = P.parse_body(await request.read())
        return json_response(rep.set_faults(patch).to_json())
    except P.ApiError as exc:
        return api_error_response(exc)
    except SimError as exc:
        return error_response(400, str(exc))


async def restart(request: web.Request) -> web.Response:
    replica_of(request).restart()
    return json_response({"restarted": True})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    # vLLM answers 200 either way; success is false while a request still holds blocks.
    return json_response({"success": replica_of(request).engine.reset_prefix_cache()})


async def timings(request: web.Request) -> web.Response:
    """Modelled vs delivered timing per finished request (for the capacity benchmark)."""
    recs = replica_of(request).engine.timings
    return json_response([[t.request_id, t.tokens, t.modelled_ttft, t.modelled_itl, t.engine_ttft,
                   t.engine_itl] for t in recs])  # fmt: skip


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", ping)
    app.router.add_post("/ping", ping)
    app.router.add_get("/load", load)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/kv_event_sources", kv_event_sources)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/_sim/faults", get_faults)
    app.router.add_post("/_sim/faults", post_faults)
    app.router.add_post("/_sim/restart", restart)
    app.router.add_get("/_sim/timings", timings)
