"""Named SSE frames and their parser (the Responses and Anthropic Messages streams)."""

from __future__ import annotations

import pytest

from vllm_api.named_sse import NamedEvent, NamedSseParser, frame
from vllm_api.sse import SseError


def test_frame_is_the_name_then_one_data_line() -> None:
    assert frame("message_stop", b'{"type":"message_stop"}') == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_parser_reassembles_events_split_anywhere() -> None:
    raw = frame("a", b"1") + b": keep-alive\r\n\r\n" + frame("b", b"2") + b"data: 3\r\n\r\n"
    want = [NamedEvent("a", b"1"), NamedEvent("b", b"2"), NamedEvent("", b"3")]
    for cut in range(len(raw) + 1):
        parser = NamedSseParser()
        events = parser.feed(raw[:cut]) + parser.feed(raw[cut:])
        assert events == want, cut
        assert not parser.pending


def test_a_name_without_data_is_dropped_and_lines_join() -> None:
    parser = NamedSseParser()
    assert parser.feed(b"event: ghost\n\ndata: x\ndata: y\n\n") == [NamedEvent("", b"x\ny")]


def test_pending_and_size_limit() -> None:
    parser = NamedSseParser(max_event_bytes=8)
    assert parser.feed(b"event: e\ndata: 12") == []
    assert parser.pending
    with pytest.raises(SseError):
        parser.feed(b"3456789\n")
