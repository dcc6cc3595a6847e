"""Upstream error answers as vLLM shapes them: its own JSON relayed, anything else mapped."""

from __future__ import annotations

import logging

import orjson

from gateway.errors import echo
from gateway.proxy.upstream import Exchange
from vllm_api.errors import error_body

log = logging.getLogger("llm_gateway.http")

_JSON = (b"content-type", b"application/json")
# Of an upstream error body that is not vLLM's JSON, at most this much text is quoted.
_ECHO_BYTES = 1024
_ECHO_CHARS = 200


def mapped_error_body(status: int, content_type: str, body: bytes) -> bytes | None:
    """vLLM's error body for an upstream error that lacks it; None: it is vLLM's, relay it."""
    if "json" in content_type:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
        # vLLM's shape, or its older flat one ({"object": "error", "message": ...}).
        if isinstance(data, dict) and (
            isinstance(data.get("error"), dict) or data.get("object") == "error"
        ):
            return None
    verb = "refused the request" if status < 500 else "failed"
    message = f"The model server {verb} (HTTP {status})."
    if content_type.startswith("text/plain"):
        # Quoted, bounded and inside a JSON string: never the upstream's bytes as they came.
        text = " ".join(body[:_ECHO_BYTES].decode("utf-8", "replace").split())
        if text:
            message = f"{message[:-1]}: {echo(text, _ECHO_CHARS)}"
    return error_body(message, status)


def relay_error(
    exchange: Exchange, out_headers: list[tuple[bytes, bytes]], request_id: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The body and headers for the client of an upstream error answer (status kept)."""
    content_type = exchange.response.headers.get("content-type", "").lower()
    mapped = mapped_error_body(exchange.status, content_type, exchange.first)
    if mapped is None:
        return exchange.first, out_headers
    log.warning(
        "request %s: replica %s answered %d (%s) without vLLM's error body: %r",
        request_id,
        exchange.lease.replica.name,
        exchange.status,
        content_type or "no content-type",
        exchange.first[:200],
    )
    return mapped, [*(h for h in out_headers if h[0] != b"content-type"), _JSON]
