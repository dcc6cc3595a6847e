"""The incremental SSE parser: any chunking gives the same events."""

from __future__ import annotations

import random

import pytest

from vllm_api.sse import DONE, SseError, SseParser

STREAM = (
    b'data: {"a": 1}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"b":\n'
    b"data: 2}\r\n\r\n"
    b"event: ignored\nid: 7\ndata:no-space\r\r"
    b'data: {"error": {"message": "boom", "code": 500}}\n\n'
    b"data: [DONE]\n\n"
)
EVENTS = [
    b'{"a": 1}',
    b'{"b":\n2}',
    b"no-space",
    b'{"error": {"message": "boom", "code": 500}}',
    DONE,
]


def _parse(chunks: list[bytes]) -> tuple[list[bytes], SseParser]:
    parser = SseParser()
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out, parser


def test_whole_stream_at_once() -> None:
    events, parser = _parse([STREAM])
    assert events == EVENTS
    assert not parser.pending


@pytest.mark.parametrize("seed", range(20))
def test_random_chunk_boundaries(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 30)))
    chunks = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
    events, parser = _parse(chunks)
    assert events == EVENTS
    assert not parser.pending


def test_byte_by_byte_and_crlf_split_across_chunks() -> None:
    events, _ = _parse([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert events == EVENTS
    # A CR ending one chunk and its LF starting the next is one line end, not two.
    events, _ = _parse([b"data: x\r", b"\n\r", b"\ndata: y\r\n\r\n"])
    assert events == [b"x", b"y"]


def test_an_unfinished_event_is_pending() -> None:
    events, parser = _parse([b'data: {"a": 1}\n\ndata: {"cut'])
    assert events == [b'{"a": 1}']
    assert parser.pending
    _, parser = _parse([b"data: done\n"])  # the blank line that ends the event never came
    assert parser.pending


def test_oversized_event_is_refused() -> None:
    parser = SseParser(max_event_bytes=64)
    with pytest.raises(SseError):
        parser.feed(b"data: " + b"x" * 100)
    parser = SseParser(max_event_bytes=64)
    with pytest.raises(SseError):
        for _ in range(10):
            parser.feed(b"data: " + b"x" * 10 + b"\n")
