"""A static vLLM-shaped upstream that is never the bottleneck: raw asyncio.Protocol under uvloop.

`python -m benchmarks.static_upstream --port 0` prints `listening on http://HOST:PORT` once bound.
It answers POST /v1/chat/completions with a fixed ~400-byte chat completion, or, when the body
has `"stream": true`, a fixed number of chat-delta SSE events then `data: [DONE]`, one chunk each
in chunked encoding, one per loop tick or `--gap-ms` apart; GET /health (200, empty) and
GET /v1/models; anything else is a 404.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import cast

import orjson
import uvloop

MODEL = "overhead-bench"
_CREATED = 1_700_000_000
_ID = "chatcmpl-0123456789abcdef0123456789abcdef"
# A request head larger than this without its terminating blank line is refused.
_MAX_HEAD = 16 * 1024


def chat_completion() -> bytes:
    """The fixed ~400-byte chat completion body."""
    return orjson.dumps(
        {
            "id": _ID,
            "object": "chat.completion",
            "created": _CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "The quick brown fox jumps over the lazy dog.",
                        "reasoning_content": None,
                        "tool_calls": [],
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                    "stop_reason": None,
                }
            ],
            "usage": {
                "prompt_tokens": 16,
                "total_tokens": 28,
                "completion_tokens": 12,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


def _sse_event(delta: dict[str, str], finish: str | None) -> bytes:
    chunk = {
        "id": _ID,
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def stream_events(n: int) -> list[bytes]:
    """The n chat-delta events of one streamed answer followed by `data: [DONE]` (n >= 2)."""
    events = [_sse_event({"role": "assistant", "content": ""}, None)]
    events += [_sse_event({"content": f" tok{i}"}, None) for i in range(1, n - 1)]
    events.append(_sse_event({"content": "."}, "stop"))
    events.append(b"data: [DONE]\n\n")
    return events


def _response(status: str, ctype: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status.encode(),
        ctype,
        len(body),
        body,
    )


_JSON = b"application/json"
_HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
_MODELS = _response(
    "200 OK",
    _JSON,
    orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": MODEL,
                    "object": "model",
                    "created": _CREATED,
                    "owned_by": "vllm",
                    "root": MODEL,
                    "parent": None,
                    "max_model_len": 4096,
                    "permission": [],
                }
            ],
        }
    ),
)
_NOT_FOUND = _response(
    "404 Not Found",
    _JSON,
    b'{"error":{"message":"Not Found","type":"NotFoundError","param":null,"code":404}}',
)
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


class StaticUpstream(asyncio.Protocol):
    """One keep-alive connection; requests are answered in order, a stream one event per tick."""

    def __init__(self, completion: bytes, events: list[bytes], gap_s: float = 0.0) -> None:
        self._completion = completion
        self._chunks = [_http_chunk(e) for e in events]
        self._gap_s = gap_s
        self._scheduled = False
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._next_event = -1  # index of the next event while streaming, -1 when idle
        self._paused = False
        self._close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._next_event >= 0 and not self._scheduled:
            self._tick()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._next_event < 0:
            self._process()

    def _process(self) -> None:
        buf = self._buf
        while self._transport is not None and self._next_event < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self._fail()
                return
            head = bytes(buf[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                value = head[at + 17 : stop if stop >= 0 else len(head)].strip()
                if not value.isdigit():
                    self._fail()
                    return
                length = int(value)
            elif b"\r\ntransfer-encoding:" in head:
                self._fail()  # aiohttp and the load generator always send a content-length
                return
            if len(buf) < end + 4 + length:
                return
            body = bytes(buf[end + 4 : end + 4 + length])
            del buf[: end + 4 + length]
            self._close_after = b"\r\nconnection: close" in head
            self._answer(head[: head.find(b" http/")], body)

    def _answer(self, line: bytes, body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if line == b"post /v1/chat/completions":
            try:
                stream = orjson.loads(body).get("stream") is True
            except (orjson.JSONDecodeError, AttributeError):
                self._fail()
                return
            if stream:
                transport.write(_STREAM_HEAD)
                self._next_event = 0
                self._tick()
                return
            transport.write(self._completion)
        elif line == b"get /health":
            transport.write(_HEALTH)
        elif line == b"get /v1/models":
            transport.write(_MODELS)
        else:
            transport.write(_NOT_FOUND)
        if self._close_after:
            transport.close()
            self._transport = None

    def _tick(self) -> None:
        # One event per loop iteration (or per gap), like a replica's engine step: the peer
        # sees separate writes rather than one coalesced buffer.
        self._scheduled = False
        transport = self._transport
        if transport is None or self._paused or self._next_event < 0:
            return
        transport.write(self._chunks[self._next_event])
        self._next_event += 1
        if self._next_event < len(self._chunks):
            loop = asyncio.get_running_loop()
            if self._gap_s > 0:
                loop.call_later(self._gap_s, self._tick)
            else:
                loop.call_soon(self._tick)
            self._scheduled = True
            return
        transport.write(b"0\r\n\r\n")
        self._next_event = -1
        if self._close_after:
            transport.close()
            self._transport = None
        elif self._buf:
            self._process()

    def _fail(self) -> None:
        if self._transport is not None:
            self._transport.write(_BAD_REQUEST)
            self._transport.close()
            self._transport = None


def completion_response() -> bytes:
    """The whole HTTP response to a non-streamed chat completion."""
    return _response("200 OK", _JSON, chat_completion())


async def start(host: str, port: int, chunks: int, gap_ms: float = 0.0) -> asyncio.Server:
    """Listen on host:port (0 = ephemeral) and return the running server."""
    loop = asyncio.get_running_loop()
    completion = completion_response()
    events = stream_events(chunks)
    return await loop.create_server(
        lambda: StaticUpstream(completion, events, gap_ms / 1e3), host, port, backlog=1024
    )


async def _main(host: str, port: int, chunks: int, gap_ms: float) -> None:
    server = await start(host, port, chunks, gap_ms)
    bound = server.sockets[0].getsockname()
    print(f"listening on http://{bound[0]}:{bound[1]}", flush=True)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m benchmarks.static_upstream`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = ephemeral (printed on start)")
    parser.add_argument(
        "--chunks", type=int, default=64, help="chat-delta events per streamed answer (>= 2)"
    )
    parser.add_argument(
        "--gap-ms", type=float, default=0.0, help="pause between SSE events (0 = next loop tick)"
    )
    args = parser.parse_args(argv)
    if args.chunks < 2:
        parser.error("--chunks must be >= 2")
    try:
        uvloop.run(_main(args.host, args.port, args.chunks, args.gap_ms))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
