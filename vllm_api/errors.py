"""vLLM's error body, the error type it names for each HTTP status, and the package's root error."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import orjson


class VllmApiError(Exception):
    """Root error of the vllm_api package: bytes that are not what vLLM sends or accepts."""


# The `type` of vLLM's error body for each status the gateway or the simulator answers with.
ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "BadRequestError",
        401: "AuthenticationError",
        403: "PermissionDeniedError",
        404: "NotFoundError",
        405: "MethodNotAllowedError",
        408: "RequestTimeoutError",
        413: "RequestEntityTooLargeError",
        429: "RateLimitError",
        431: "RequestHeaderFieldsTooLargeError",
        500: "InternalServerError",
        502: "BadGatewayError",
        503: "ServiceUnavailableError",
        504: "GatewayTimeoutError",
    }
)


def error_type(status: int) -> str:
    """The error type of `status`: from the table, else by class (client or server error)."""
    found = ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "BadRequestError" if status < 500 else "InternalServerError"


def error_body(
    message: str, status: int, param: str | None = None, *, err_type: str | None = None
) -> bytes:
    """vLLM 0.32's error body: {"error": {message, type, param, code}} with an int code."""
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": err_type if err_type is not None else error_type(status),
                "param": param,
                "code": status,
            }
        }
    )
