"""Server-Sent Events as vLLM streams them: one event's frame, and an incremental parser."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from vllm_api.errors import VllmApiError, error_body

# SSE lines end in CRLF, LF or a lone CR (WHATWG HTML, "Parsing an event stream").
_EOL = re.compile(rb"\r\n|\r|\n")
# The data of the event that ends every successful stream, and that event framed.
DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
# What a parser makes of one complete event.
E = TypeVar("E")


def event(data: bytes) -> bytes:
    """One SSE event carrying `data` (a single line: vLLM's JSON has no raw newlines)."""
    return b"data: " + data + b"\n\n"


def error_event(message: str, status: int) -> bytes:
    """vLLM's in-stream error: its error body as an event; no [DONE] follows it."""
    return event(error_body(message, status))


class SseError(VllmApiError):
    """The stream is not well-formed SSE, or an event outgrew the size limit."""


class EventParser(ABC, Generic[E]):
    """Feed raw chunks; get every event they complete, in order, as `_event` makes it."""

    __slots__ = ("_buf", "_data", "_max_event_bytes", "_name", "_size")

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = b""
        self._name = b""
        self._data: list[bytes] = []
        self._size = 0
        self._max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[E]:
        """The events (multi-line data joined by LF) that `chunk` completes."""
        buf = self._buf + chunk if self._buf else chunk
        events: list[E] = []
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
        return bool(self._buf.strip(b"\r")) or bool(self._data)

    @abstractmethod
    def _event(self, name: bytes, data: bytes) -> E:
        """One complete event as this parser hands it out."""

    def _line(self, line: bytes, events: list[E]) -> None:
        if not line:
            if self._data:
                events.append(self._event(self._name, b"\n".join(self._data)))
            # An event without data is dispatched by no SSE client: drop its name too.
            self._data, self._name, self._size = [], b"", 0
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
            self._name = value
        # id and retry fields carry nothing vLLM uses.


class SseParser(EventParser[bytes]):
    """Feed raw chunks; get the `data` of every event they complete, in order."""

    __slots__ = ()

    def _event(self, name: bytes, data: bytes) -> bytes:
        return data
