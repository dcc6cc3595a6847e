"""How each request of the fault suite ended, and the sums that must add up: pure, no I/O.

Every request the load generator sends ends in exactly one record. A record is `complete` (a
stream that ended with `[DONE]`, or a non-streamed 200 with choices), `error` (a clear error:
an HTTP status with vLLM's JSON error body, or a stream ended by vLLM's SSE error event),
`cancelled` (the client left on purpose, mid-stream) or `lost` (anything else: no answer by
its deadline, a reset, a stream that just stopped, an error in no recognisable shape). A sent
request with no record at all is lost too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from vllm_api.sse import DONE

COMPLETE, ERROR, CANCELLED, LOST = "complete", "error", "cancelled", "lost"
KINDS = (COMPLETE, ERROR, CANCELLED, LOST)


@dataclass(frozen=True, slots=True)
class Record:
    """One request's end: its kind, a detail naming how, and when (seconds since the start)."""

    index: int
    kind: str
    # complete: "stream" | "unary"; error: "http_<status>" | "sse_<code>"; cancelled:
    # "after_<n>_events"; lost: "hang", "truncated", "transport:<exception>", "unclear_...".
    detail: str
    status: int
    started: float
    ended: float
    events: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown record kind {self.kind!r}")


def vllm_error(obj: Any) -> int | None:
    """The code of vLLM's error shape, {"error": {message, type, param, code}}; else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("error"), dict):
        return None
    err = obj["error"]
    code = err.get("code")
    if not (isinstance(err.get("message"), str) and isinstance(err.get("type"), str)):
        return None
    if "param" not in err or not isinstance(code, int) or isinstance(code, bool):
        return None
    return code


def http_outcome(status: int, body: bytes) -> tuple[str, str]:
    """(kind, detail) of a whole answer: a 200 with choices, or a status in vLLM's shape."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return LOST, f"unclear_http_{status}"
    if status == 200:
        ok = isinstance(obj, dict) and isinstance(obj.get("choices"), list) and obj["choices"]
        return (COMPLETE, "unary") if ok else (LOST, "unclear_http_200")
    code = vllm_error(obj)
    if code is None:
        return LOST, f"unclear_http_{status}"
    return ERROR, f"http_{status}"


class StreamVerdict:
    """Reads a 200 stream's SSE lines; says at its end whether it was complete or a clear error."""

    __slots__ = ("_after_end", "_done", "_error", "events")

    def __init__(self) -> None:
        self.events = 0
        self._done = False
        self._error: str | None = None
        self._after_end = False

    def feed(self, line: bytes) -> None:
        """One line of the body (with or without its newline)."""
        line = line.strip()
        if not line.startswith(b"data:"):
            return  # blank separators, comments
        data = line[5:].strip()
        if self._done or self._error is not None:
            self._after_end = True  # nothing may follow [DONE] or an error event
        self.events += 1
        if data == DONE:
            self._done = True
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._error = "unclear_sse_event"
            return
        if isinstance(obj, dict) and "error" in obj:
            code = vllm_error(obj)
            self._error = "unclear_sse_error" if code is None else f"sse_{code}"

    def outcome(self) -> tuple[str, str]:
        """(kind, detail) once the body ended cleanly."""
        if self._after_end:
            return LOST, "events_after_end"
        if self._error is not None:
            return (ERROR, self._error) if self._error.startswith("sse_") else (LOST, self._error)
        if self._done:
            return COMPLETE, "stream"
        return LOST, "truncated"


@dataclass(frozen=True, slots=True)
class Summary:
    """The sums of one run: every sent request in exactly one of the kinds."""

    sent: int
    completed: int
    errors: int
    cancelled: int
    lost: int
    errors_by_kind: dict[str, int]
    lost_by_kind: dict[str, int]
    # Sent but never recorded (counted in `lost` as "no_record").
    unrecorded: int
    longest_s: float

    @property
    def counts_match(self) -> bool:
        return self.completed + self.errors + self.cancelled + self.lost == self.sent

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "completed": self.completed,
            "errors": self.errors,
            "errors_by_kind": self.errors_by_kind,
            "cancelled": self.cancelled,
            "lost": self.lost,
            "lost_by_kind": self.lost_by_kind,
            "unrecorded": self.unrecorded,
            "counts_match": self.counts_match,
            "longest_request_s": round(self.longest_s, 3),
        }


def summarize(records: list[Record], sent: int) -> Summary:
    """Sum the records of `sent` requests; a record twice for one request is a bug, raised."""
    seen = Counter(r.index for r in records)
    twice = sorted(i for i, n in seen.items() if n > 1)
    if twice:
        raise ValueError(f"requests recorded more than once: {twice[:10]}")
    unknown = sorted(i for i in seen if not 0 <= i < sent)
    if unknown:
        raise ValueError(f"records of requests never sent: {unknown[:10]}")
    kinds = Counter(r.kind for r in records)
    errors = Counter(r.detail for r in records if r.kind == ERROR)
    lost = Counter(r.detail for r in records if r.kind == LOST)
    unrecorded = sent - len(records)
    if unrecorded:
        lost["no_record"] += unrecorded
    return Summary(
        sent=sent,
        completed=kinds[COMPLETE],
        errors=kinds[ERROR],
        cancelled=kinds[CANCELLED],
        lost=kinds[LOST] + unrecorded,
        errors_by_kind=dict(sorted(errors.items())),
        lost_by_kind=dict(sorted(lost.items())),
        unrecorded=unrecorded,
        longest_s=max((r.ended - r.started for r in records), default=0.0),
    )
