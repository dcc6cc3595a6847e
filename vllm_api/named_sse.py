"""Named Server-Sent Events (``event: <name>`` + ``data: <json>``), as vLLM streams the
Responses and Anthropic Messages routes: one event's frame, and an incremental parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_api.sse import SseError

# SSE lines end in CRLF, LF or a lone CR (WHATWG HTML, "Parsing an event stream").
_EOL = re.compile(rb"\r\n|\r|\n")


def frame(name: str, data: bytes) -> bytes:
    """One named event: vLLM writes the name line, then a single data line (compact JSON)."""
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class NamedEvent:
    """One complete event: its name ("" when the stream sent none) and its data."""

    name: str
    data: bytes


class NamedSseParser:
    """Feed raw chunks; get every event they complete, with its name, in order."""

    __slots__ = ("_buf", "_data", "_max_event_bytes", "_name", "_size")

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = b""
        self._name = ""
        self._data: list[bytes] = []
        self._size = 0
        self._max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[NamedEvent]:
        buf = self._buf + chunk if self._buf else chunk
        events: list[NamedEvent] = []
        pos = 0
        while (m := _EOL.search(buf, pos)) is not None:
            # A CR at the very end may be the first half of a CRLF split across chunks.
            if m.group() == b"\r" and m.end() == len(buf):
                break
            self._line(buf[pos : m.start()], events)
            pos = m.end()
        self._buf = buf[pos:]
        if len(self._buf) + self._size > self._max_event_bytes:
            raise SseError(f"an event exceeds {self._max_event_bytes} bytes")
        return events

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are buffered (the stream stopped mid-event)."""
        return bool(self._buf.strip(b"\r")) or bool(self._data) or bool(self._name)

    def _line(self, line: bytes, events: list[NamedEvent]) -> None:
        if not line:
            if self._data:
                events.append(NamedEvent(self._name, b"\n".join(self._data)))
            # An event without data is dispatched by no SSE client: drop its name too.
            self._data, self._name, self._size = [], "", 0
            return
        if line[0] == 0x3A:  # ":" starts a comment (keep-alive)
            return
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._size += len(value) + 1
            if self._size > self._max_event_bytes:
                raise SseError(f"an event exceeds {self._max_event_bytes} bytes")
            self._data.append(value)
        elif field == b"event":
            self._name = value.decode("utf-8", errors="replace")
