"""Gateway errors, upstream error answers and broken streams as gRPC statuses (no upstream leak)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import orjson

from gateway.errors import GatewayError

_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    # Every replica failed before answering: transient, as Envoy's gRPC bridge maps a 502.
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# What the replica said for these is about the request itself, so the client sees it (the HTTP
# front end relays the same body); anything else from upstream gets a generic message.
_RELAYED = frozenset({400, 404, 408, 413, 422, 429})
# Status details travel in an HTTP/2 header: keep them well under clients' 8 KiB header limit.
_MAX_MESSAGE = 1024
TRUNCATED = "The model server stopped streaming before the answer was complete."
FAILED = "The model server failed to serve the request."
DEADLINE = "The deadline expired before the answer was complete."
# A client told to back off without a figure from upstream still gets one to wait on.
_DEFAULT_RETRY_S = 1.0
_BACK_OFF = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})


class GrpcFailure(Exception):
    """One RPC's failure as a gRPC status; `replica_fault` feeds passive health like HTTP's 5xx."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        retry_after_s: float | None = None,
        replica_fault: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:_MAX_MESSAGE]
        self.retry_after_s = retry_after_s
        self.replica_fault = replica_fault

    def trailing_metadata(self, request_id: str) -> tuple[tuple[str, str], ...]:
        """x-request-id, and retry-delay (a protobuf Duration string) on back-off codes."""
        out = [("x-request-id", request_id)]
        delay = self.retry_after_s
        if delay is None and self.code in _BACK_OFF:
            delay = _DEFAULT_RETRY_S
        if delay is not None:
            out.append(("retry-delay", f"{max(delay, 0.0):g}s"))
        return tuple(out)


def code_for(status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP status."""
    return _CODES.get(status, grpc.StatusCode.INTERNAL)


def from_gateway_error(err: GatewayError) -> GrpcFailure:
    """A gateway error's message is client-safe by contract: keep it, map the status."""
    return GrpcFailure(code_for(err.status), err.message, retry_after_s=err.retry_after_s)


def _message(data: Any) -> str | None:
    if not isinstance(data, Mapping):
        return None
    inner = data.get("error")
    # vLLM 0.32 nests the error; older releases answer a flat {"object": "error", ...}.
    source = inner if isinstance(inner, Mapping) else data
    msg = source.get("message")
    return msg if isinstance(msg, str) and msg else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare from a replica and not worth parsing here


def from_upstream(status: int, body: bytes, headers: Mapping[str, str]) -> GrpcFailure:
    """A replica's non-200 answer (a 4xx: the pipeline retries 5xx elsewhere)."""
    if status not in _RELAYED:
        return GrpcFailure(grpc.StatusCode.INTERNAL, FAILED, replica_fault=status >= 500)
    try:
        message = _message(orjson.loads(body))
    except orjson.JSONDecodeError:
        message = None
    retry = _retry_after(headers) if status == 429 else None
    return GrpcFailure(code_for(status), message or FAILED, retry_after_s=retry)


def from_stream_error(data: Mapping[str, Any]) -> GrpcFailure:
    """An error event (`data: {"error": ...}`) after the stream started: the answer is cut."""
    inner = data.get("error")
    code = inner.get("code") if isinstance(inner, Mapping) else None
    status = code if isinstance(code, int) else 500
    if status in _RELAYED:
        return GrpcFailure(code_for(status), _message(data) or FAILED, replica_fault=False)
    return GrpcFailure(grpc.StatusCode.INTERNAL, TRUNCATED, replica_fault=True)
