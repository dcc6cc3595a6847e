"""One attempt at one replica: send the request, wait for its head and first byte, in time."""

from __future__ import annotations

import asyncio
import logging

from gateway.config import UpstreamConfig
from gateway.errors import GatewayError, UpstreamFailed, UpstreamTimeout
from gateway.proxy.requests import Kind, ParsedRequest
from gateway.proxy.responses_route import stored_path
from gateway.proxy.upstream import Exchange, Upstream, UpstreamResponse
from gateway.proxy.versions import Traffic
from gateway.replicas.pool import Lease
from routing.types import Decision

log = logging.getLogger("llm_gateway.pipeline")

PATHS: dict[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "chat_batch": "/v1/chat/completions/batch",
    "transcription": "/v1/audio/transcriptions",
    "translation": "/v1/audio/translations",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "count_tokens": "/v1/messages/count_tokens",
    "tokenize": "/tokenize",
    "detokenize": "/detokenize",
    "embeddings": "/v1/embeddings",
    "pooling": "/pooling",
    "classify": "/classify",
    # vLLM's own paths for these; its /v1 aliases serve the same and log a deprecation.
    "score": "/score",
    "rerank": "/rerank",
}
# An error body from a failing replica is read only to be logged, and only this much of it.
_ERROR_BODY_LOG_LIMIT = 512


class Retryable(Exception):
    """An attempt failed before any byte reached the client; another replica may serve it."""

    def __init__(
        self, reason: str, client_error: GatewayError, detail: str = "", unsent: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.client_error = client_error
        # The start of the replica's error body: the outlier policy looks for OOM in it.
        self.detail = detail
        # The replica refused the connection: the request cost it nothing.
        self.unsent = unsent


async def try_replica(
    upstream: Upstream,
    cfg: UpstreamConfig,
    traffic: Traffic,
    req: ParsedRequest,
    headers: dict[str, str],
    decision: Decision,
    lease: Lease,
    started: float,
) -> Exchange:
    """The exchange once its first byte is in; Retryable when the replica failed before it."""
    url = decision.replica.url + (stored_path(req) or PATHS[req.kind])
    replica = lease.replica
    transport_errors = upstream.transport_errors
    # Retrieval is the one GET: no body, and the headers of one would mislead the replica.
    get = req.kind == "response_get"
    body = b"" if get else traffic.upstream_body(req, replica.config, headers)
    # Streams: the head within response_head_timeout_s, the first chunk within
    # first_byte_timeout_s of the start. A non-streamed answer's head comes with its body.
    total = cfg.first_byte_timeout_s if req.stream else cfg.non_stream_timeout_s
    head = min(cfg.response_head_timeout_s, total) if req.stream else total
    now = asyncio.get_running_loop().time()
    resp: UpstreamResponse | None = None
    try:
        async with asyncio.timeout_at(now + head) as deadline:
            # Registered so that health checks marking the replica down end the wait.
            replica.awaiting.add(deadline)
            try:
                if get:
                    sent = {k: v for k, v in headers.items() if k != "content-type"}
                    resp = await upstream.get(url, sent)
                else:
                    resp = await upstream.post(url, body, headers)
                if head < total:
                    deadline.reschedule(now + total)
                first, streaming = await _first(req, resp, replica.name)
            finally:
                replica.awaiting.discard(deadline)
    except TimeoutError:
        if resp is not None:
            resp.close()
        reason = "timeout"
        if replica.probe_down:
            reason = "replica_down"
        elif resp is None and head < total:
            reason = "head_timeout"
        raise Retryable(
            reason, UpstreamTimeout("The model server did not answer in time.")
        ) from None
    except transport_errors as exc:
        if resp is not None:
            resp.close()
        raise Retryable(
            type(exc).__name__,
            UpstreamFailed("The model server could not be reached."),
            unsent=isinstance(exc, ConnectionRefusedError)
            or isinstance(getattr(exc, "os_error", None), ConnectionRefusedError),
        ) from None
    except BaseException:
        if resp is not None:
            resp.close()
        raise
    return Exchange(
        lease=lease,
        decision=decision,
        response=resp,
        status=resp.status,
        first=first,
        streaming=streaming,
        idle_timeout_s=cfg.idle_timeout_s,
        started=started,
        transport_errors=transport_errors,
        complete=not streaming,
    )


async def _first(req: ParsedRequest, resp: UpstreamResponse, name: str) -> tuple[bytes, bool]:
    """(the whole body or a stream's first chunk, streaming) of an answer whose head came."""
    if resp.status >= 500:
        detail = (await resp.content.read(_ERROR_BODY_LOG_LIMIT)).decode("utf-8", "replace")
        log.warning("replica %s answered %d: %s", name, resp.status, detail)
        raise Retryable(
            f"status_{resp.status}",
            UpstreamFailed(
                f"The model server failed to serve the request (HTTP {resp.status}).",
                status=resp.status if resp.status in (502, 503, 504) else 502,
            ),
            detail,
        )
    if req.stream and resp.status == 200:
        first = await resp.content.readany()
        if not first:
            raise Retryable("empty_stream", UpstreamFailed("The model server closed the stream."))
        return first, True
    return await resp.read(), False
