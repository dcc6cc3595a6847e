"""A pooling replica's /score and /rerank (vLLM serves both for an embedding model): cosine
similarity of the texts' embeddings, in vLLM 0.32's answer shapes (pooling/scoring/)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from simulator import protocol as P
from simulator.http_util import api_error_response, json_response, replica_of
from simulator.pooling import embed
from vllm_api.pooling import pooling_usage

# ScoreRequest's accepted pairs of fields, in vLLM's union order.
_PAIRS = (("data_1", "data_2"), ("queries", "documents"), ("queries", "items"),
          ("text_1", "text_2"))  # fmt: skip


def _texts(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise P.invalid("Input should be a valid string or a list of strings", f"body.{name}")


def _scores(request: web.Request, queries: list[str], docs: list[str]) -> tuple[list[float], int]:
    """Each (query, document) pair's cosine similarity, and the prompt tokens embedded."""
    if len(queries) not in (1, len(docs)):
        raise P.bad_request("Input lengths must be either 1:1, 1:N or N:N")
    rep = replica_of(request)
    size = rep.config.embedding_size
    q_ids = [rep.encode_prompt(q, chat=False) for q in queries]
    d_ids = [rep.encode_prompt(d, chat=False) for d in docs]
    q_vecs = [embed(ids, size, None, True) for ids in q_ids]
    d_vecs = [embed(ids, size, None, True) for ids in d_ids]
    pairs = [(q_vecs[0 if len(q_vecs) == 1 else i], d) for i, d in enumerate(d_vecs)]
    scores = [sum(a * b for a, b in zip(q, d, strict=True)) for q, d in pairs]
    return scores, sum(map(len, q_ids)) + sum(map(len, d_ids))


def _model(request: web.Request, body: dict[str, Any]) -> str:
    served = replica_of(request).served
    model = body.get("model")
    if model is not None and model not in served:
        raise P.ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    return str(model or served[0])


async def score(request: web.Request) -> web.Response:
    try:
        body = P.parse_body(await request.read())
        pair = next((p for p in _PAIRS if p[0] in body and p[1] in body), None)
        if pair is None:
            raise P.invalid("Field required", "body.text_1")
        model = _model(request, body)
        scores, tokens = _scores(request, _texts(body[pair[0]], pair[0]),
                                 _texts(body[pair[1]], pair[1]))  # fmt: skip
    except P.ApiError as exc:
        return api_error_response(exc)
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    answer = {"id": f"score-{rid}", "object": "list", "created": int(time.time()),
              "model": model, "data": data, "usage": pooling_usage(tokens)}  # fmt: skip
    return json_response(answer)


async def rerank(request: web.Request) -> web.Response:
    try:
        body = P.parse_body(await request.read())
        if "query" not in body or "documents" not in body:
            raise P.invalid("Field required", "body.query" if "query" not in body else
                            "body.documents")  # fmt: skip
        query = body["query"]
        if not isinstance(query, str):
            raise P.invalid("Input should be a valid string", "body.query")
        model = _model(request, body)
        docs = _texts(body["documents"], "documents")
        scores, tokens = _scores(request, [query], docs)
        top_n = body.get("top_n", 0)
        if not isinstance(top_n, int) or top_n < 0:
            raise P.invalid("Input should be greater than or equal to 0", "body.top_n")
    except P.ApiError as exc:
        return api_error_response(exc)
    results = [{"index": i, "document": {"text": d, "multi_modal": None}, "relevance_score": s}
               for i, (d, s) in enumerate(zip(docs, scores, strict=True))]  # fmt: skip
    results.sort(key=lambda r: float(r["relevance_score"]), reverse=True)  # type: ignore[arg-type]
    if 0 < top_n < len(docs):
        results = results[:top_n]
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_response({"id": f"score-{rid}", "model": model, "usage": usage,
                          "results": results})  # fmt: skip


def add_routes(app: web.Application) -> None:
    for path in ("/score", "/v1/score"):
        app.router.add_post(path, score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.router.add_post(path, rerank)
