"""vLLM's Anthropic usage and stop-reason mapping, and the Responses event numbering."""

from __future__ import annotations

import json

from vllm_api import anthropic as A
from vllm_api.named_sse import NamedSseParser
from vllm_api.responses import StreamEvents


def test_usage_excludes_cache_reads_and_writes_from_input_tokens() -> None:
    assert A.usage(141, 3, 128, 0) == {"input_tokens": 13, "output_tokens": 3,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 128}  # fmt: skip
    assert A.usage(141, 3, 0, 128)["input_tokens"] == 13
    # Without prompt-token details the cache fields are left out, not zero.
    assert A.usage(16, 4, None, None) == {"input_tokens": 16, "output_tokens": 4}


def test_stop_reasons() -> None:
    assert A.stop_reason("length", None) == ("max_tokens", None)
    assert A.stop_reason("stop", "ab") == ("stop_sequence", "ab")
    assert A.stop_reason("stop", None) == ("end_turn", None)
    assert A.stop_reason("abort", None) == (None, None)


def test_error_shapes() -> None:
    assert json.loads(A.error_body("NotFoundError", "gone")) == {
        "type": "error", "error": {"type": "NotFoundError", "message": "gone"}}  # fmt: skip
    (event,) = NamedSseParser().feed(A.stream_error_event("boom"))
    assert event.name == "error"
    assert json.loads(event.data)["error"] == {"type": "internal_error", "message": "boom"}


def test_responses_events_are_numbered_in_order() -> None:
    ev = StreamEvents("msg_1")
    raw = ev.response("response.created", {"id": "r"}) + ev.opened() + ev.delta("a")
    raw += ev.closed("a")
    events = NamedSseParser().feed(raw)
    assert [e.name for e in events] == [
        "response.created", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
    ]  # fmt: skip
    for i, e in enumerate(events):
        data = json.loads(e.data)
        assert (data["type"], data["sequence_number"]) == (e.name, i)
