"""vLLM's OpenAI Responses wire format: the response object, usage, and stream events."""

from __future__ import annotations

from typing import Any

import orjson

from vllm_api.named_sse import frame

# The events of a streamed text answer, in vLLM's order (the delta repeats; the item and part
# events appear only once text arrives); every event's data carries its sequence_number.
STREAM_EVENTS = (
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
)
# A response's status once it ended; cancel refuses these (and vLLM says "synchronous").
FINAL_STATUSES = frozenset({"completed", "incomplete", "cancelled", "failed"})


def usage_body(prompt: int, cached: int, created: int, output: int) -> dict[str, Any]:
    """``usage`` as vLLM fills ResponseUsage for a single-turn text answer."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": cached,
            "cache_write_tokens": created,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + output,
    }


def output_text(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant output message; ``text`` None gives the empty content of an open item."""
    content = [] if text is None else [output_text(text, None)]
    return {"id": item_id, "content": content, "role": "assistant", "status": status,
            "type": "message", "phase": None}  # fmt: skip


class StreamEvents:
    """The frames of one streamed response, numbered as vLLM numbers them (from 0)."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.seq = 0

    def _frame(self, name: str, body: dict[str, Any]) -> bytes:
        body["sequence_number"] = self.seq
        body["type"] = name
        self.seq += 1
        return frame(name, orjson.dumps(body))

    def _at(self) -> dict[str, Any]:
        return {"content_index": 0, "item_id": self.item_id, "output_index": 0}

    def response(self, name: str, response: dict[str, Any]) -> bytes:
        """response.created / in_progress / completed carrying the whole response object."""
        return self._frame(name, {"response": response})

    def opened(self) -> bytes:
        item = message_item(self.item_id, None, "in_progress")
        part = {"content_index": 0, "item_id": self.item_id, "output_index": 0,
                "part": output_text("", [])}  # fmt: skip
        return self._frame("response.output_item.added", {"item": item, "output_index": 0}) + (
            self._frame("response.content_part.added", part)
        )

    def delta(self, text: str) -> bytes:
        at = self._at()
        body = {"content_index": 0, "delta": text, "item_id": at["item_id"], "logprobs": [],
                "output_index": 0}  # fmt: skip
        return self._frame("response.output_text.delta", body)

    def closed(self, text: str) -> bytes:
        done = {"content_index": 0, "item_id": self.item_id, "logprobs": [], "output_index": 0,
                "text": text}  # fmt: skip
        part = {**self._at(), "part": output_text(text, None)}
        item = {"item": message_item(self.item_id, text, "completed"), "output_index": 0}
        return (
            self._frame("response.output_text.done", done)
            + self._frame("response.content_part.done", part)
            + self._frame("response.output_item.done", item)
        )

    def error(self, message: str, code: str | None = None) -> bytes:
        """The ``error`` event a stream ends with when generation fails (no completed)."""
        return self._frame("error", {"code": code, "message": message, "param": None})
