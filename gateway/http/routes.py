"""Which raw-ASGI route a request takes: the proxied paths and the stored-response routes."""

from __future__ import annotations

from gateway.proxy import responses_route
from gateway.proxy.requests import Kind

# POST routes proxied through the pipeline (anything else is Starlette's).
HOT_PATHS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/chat/completions/batch": "chat_batch",
    "/v1/audio/transcriptions": "transcription",
    "/v1/audio/translations": "translation",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/v1/embeddings": "embeddings",
    "/pooling": "pooling",
    "/classify": "classify",
    # vLLM serves each of these aliases with one handler (its /v1 ones only log a warning).
    "/score": "score",
    "/v1/score": "score",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
}


def hot_route(method: str, path: str) -> tuple[Kind, str | None] | None:
    """(kind, stored response id or None) of a proxied request; None for Starlette's routes."""
    if method == "POST":
        kind = HOT_PATHS.get(path)
        if kind is not None:
            return kind, None
    return responses_route.stored_route(method, path)
