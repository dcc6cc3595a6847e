"""The gateway's errors: each carries its HTTP status and a client-safe message."""

from __future__ import annotations

from vllm_api.errors import error_body, error_type

# Client values quoted in an error message are cut to this many characters.
MAX_ECHO_CHARS = 256


def echo(value: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`value` as an error message may quote it: its first `limit` characters, then "…"."""
    return value if len(value) <= limit else value[:limit] + "…"


class GatewayError(Exception):
    """Root error of the gateway: carries the HTTP status and a client-safe message."""

    status = 500

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.param = param
        self.retry_after_s = retry_after_s

    @property
    def error_type(self) -> str:
        return error_type(self.status)

    def body(self) -> bytes:
        """vLLM 0.32's error body: {"error": {message, type, param, code}} with an int code."""
        return error_body(self.message, self.status, self.param)


class InternalError(GatewayError):
    """A bug in the gateway: the client gets vLLM's 500 body, the traceback goes to the log."""

    status = 500

    def __init__(self) -> None:
        super().__init__("The gateway failed to handle the request.")


class BadRequest(GatewayError):
    status = 400


class ModelNotFound(GatewayError):
    status = 404

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{echo(model)}` does not exist.", param="model")


class PayloadTooLarge(GatewayError):
    status = 413


class Unauthorized(GatewayError):
    status = 401


class Forbidden(GatewayError):
    status = 403


class NoHealthyReplica(GatewayError):
    status = 503


class UpstreamFailed(GatewayError):
    """Every attempt failed before its first byte; details stay in the logs."""

    status = 502


class UpstreamTimeout(GatewayError):
    status = 504
