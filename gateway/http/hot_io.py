"""The hot path's request body, request id and error answers, in raw ASGI."""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import Receive, Send

from gateway.errors import BadRequest, GatewayError, PayloadTooLarge
from gateway.proxy import messages_route
from gateway.proxy.identity import new_request_id, request_id
from gateway.proxy.requests import ANTHROPIC_KINDS, Kind

_JSON = (b"content-type", b"application/json")


class ClientGone(Exception):
    """The client disconnected while its request was being served."""


class Cycle:
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


async def send_error(
    send: Send, err: GatewayError, request_id: str, kind: Kind | None = None
) -> None:
    """The gateway's own error answer, in vLLM's shape (Anthropic's on its routes)."""
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


def error_response(err: GatewayError) -> Response:
    """A Starlette route's error answer in vLLM's shape."""
    return Response(err.body(), status_code=err.status, media_type="application/json")


def request_id_of(headers: list[tuple[bytes, bytes]], header: bytes) -> str:
    """The client's request id (sanitised) from `header`, or a new one."""
    for k, v in headers:
        if k == header:
            return request_id(v.decode("latin-1"))
    return new_request_id()


async def read_body(
    headers: list[tuple[bytes, bytes]],
    receive: Receive,
    limit: int,
    timeout_s: float,
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
            raise ClientGone
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
        if not message.get("more_body", False):
            return body
        chunks.append(body)
        size = len(body)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
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
