"""Embeddings and vLLM's pooling family (pooling, classify, score, rerank) through the gateway.

These routes generate nothing, so they leave no prefix in a replica's KV cache to come back
to: they carry no cache features and are placed by load. Their bodies are the replica's to
validate (vLLM's pydantic models); the gateway only estimates their size, for admission
buckets and quotas, from the fields vLLM reads its inputs from.
"""

from __future__ import annotations

from typing import Any

# The fields holding a route's inputs (vLLM's pooling/*/protocol.py).
_INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "embeddings": ("input", "messages"),
    "pooling": ("input", "messages"),
    "classify": ("input", "messages"),
    "score": ("text_1", "text_2", "data_1", "data_2", "queries", "documents", "items"),
    "rerank": ("query", "documents"),
}


def _chars(value: Any, depth: int = 0) -> int:
    """Characters of the text in `value` (~4 per token id); any other shape counts 0."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return 4
    if depth > 4:
        return 0
    if isinstance(value, list):
        # Token ids or strings in bulk: checked in C, no Python step per item.
        types = set(map(type, value))
        if types == {int}:
            return 4 * len(value)
        if types == {str}:
            return sum(map(len, value))
        return sum(_chars(v, depth + 1) for v in value)
    if isinstance(value, dict):
        # A chat message's or a content part's text, a rerank document's text.
        return sum(_chars(value.get(k), depth + 1) for k in ("content", "text"))
    return 0


def input_chars(kind: str, data: dict[str, Any]) -> int:
    """An estimate of the characters a pooling request's inputs hold (0: none recognised)."""
    return sum(_chars(data.get(name)) for name in _INPUT_FIELDS[kind])


# vLLM's words when a route's handler is missing (its pooling/*/api_router.py).
_APIS = {
    "embeddings": "Embeddings API",
    "pooling": "Pooling API",
    "classify": "Classification API",
    "score": "Score API",
    "rerank": "Rerank (Score) API",
}


def unsupported_message(kind: str, model: str, replica: str) -> str:
    """The error for a replica without the route: vLLM attaches pooling routes by model task."""
    return (
        f"The model `{model}` does not support the {_APIS[kind]}: replica `{replica}` has no "
        "such route (vLLM serves it only for a pooling model, --runner pooling)."
    )
