"""Named Server-Sent Events (``event: <name>`` + ``data: <json>``), as vLLM streams the
Responses and Anthropic Messages routes: one event's frame, and an incremental parser."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_api.sse import EventParser


def frame(name: str, data: bytes) -> bytes:
    """One named event: vLLM writes the name line, then a single data line (compact JSON)."""
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class NamedEvent:
    """One complete event: its name ("" when the stream sent none) and its data."""

    name: str
    data: bytes


class NamedSseParser(EventParser[NamedEvent]):
    """Feed raw chunks; get every event they complete, with its name, in order."""

    __slots__ = ()

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are buffered (the stream stopped mid-event)."""
        return super().pending or bool(self._name)

    def _event(self, name: bytes, data: bytes) -> NamedEvent:
        return NamedEvent(name.decode("utf-8", errors="replace"), data)
