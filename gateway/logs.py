"""Log output: text or one JSON object per line, and the one record per request."""

from __future__ import annotations

import logging
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Marks the root handler setup_logging installed (the one it may replace).
_OURS = "llm_gateway_handler"
# The logger of the per-request records ([telemetry] request_log).
REQUEST_LOGGER = "llm_gateway.request"
# LogRecord attributes that are not a caller's `extra` fields.
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# A logfmt value printed bare; anything else is JSON-quoted.
_BARE = re.compile(r"[^\s\"=\\]+")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the `extra` fields, traceback.

    `fields`: keys every line carries (e.g. the worker's index under --workers).
    """

    def __init__(self, fields: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            # A structured record's message is its fields again: JSON says its kind instead.
            "msg": getattr(record.msg, "summary", None) or record.getMessage(),
            **self._fields,
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        # default=str: a field no JSON type fits (an exception, a path) is still one line.
        return orjson.dumps(out, default=str).decode()


def setup_logging(
    level: str,
    fmt: str = "text",
    text_format: str = TEXT_FORMAT,
    fields: dict[str, Any] | None = None,
) -> None:
    """The root logger at `level`, writing to stderr in `fmt`; `fields`: keys of every "json"
    line. Like logging.basicConfig, it leaves a root logger someone else set up (a program
    embedding the gateway, a test runner) alone; a handler of its own it replaces."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _OURS, False)]
    if root.handlers and not ours:
        return
    for old in ours:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    setattr(handler, _OURS, True)
    formatter = JsonFormatter(fields) if fmt == "json" else logging.Formatter(text_format)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one finished request was: who, what, where it went, how it ended, how long."""

    request_id: str
    tenant: str
    model: str
    replica: str
    branch: str
    status: int
    stream: bool
    # Arrival to the first upstream byte of a stream (None: not streamed, or refused).
    ttft_s: float | None
    # The prompt's length in tokens as parsed (an estimate from its characters when the
    # request did not send token ids).
    prompt_tokens: int | None
    # Prompt + completion tokens from the answer's `usage`, when it carried one.
    usage_tokens: int | None
    duration_s: float


def _logfmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        value = f"{value:.4f}"
    text = str(value)
    return text if _BARE.fullmatch(text) else orjson.dumps(text).decode()


class _Logfmt:
    """A record's fields as logfmt, rendered only if a text handler prints them."""

    summary = "request"

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(f"{k}={_logfmt(v)}" for k, v in self.fields.items())


class RequestLog:
    """Emits one INFO record per request on `llm_gateway.request` when enabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._log = logging.getLogger(REQUEST_LOGGER)

    def done(self, record: RequestRecord) -> None:
        if not self.enabled or not self._log.isEnabledFor(logging.INFO):
            return
        fields = asdict(record)
        # Text handlers print the logfmt message; the JSON formatter adds each field as a key.
        self._log.info(_Logfmt(fields), extra=fields)
