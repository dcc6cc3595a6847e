"""A client that stops reading its stream: cut after send_timeout_s, upstream cancelled."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from urllib.parse import urlsplit

import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.config import ServerConfig
from gateway.http.protocol import guarded_protocol
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, eventually, gateway_config, in_flight

SEND_TIMEOUT_S = 0.3
# 32 sequences x 8,000 tokens: far more than the socket buffers hold, and seconds to generate.
BIG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story"}],
    "max_tokens": 8000,
    "n": 32,
    "ignore_eos": True,
    "stream": True,
}


@pytest.fixture
async def one_replica() -> AsyncIterator[SimFleet]:
    # KV room for every sequence: the answer runs for seconds unless it is aborted.
    async with SimFleet(replace(SIM, num_gpu_blocks=32768), replicas=1, base_port=0) as f:
        yield f


def _running(fleet: SimFleet) -> int:
    return sum(r.engine.num_running + r.engine.num_waiting for r in fleet.replicas)


def _stalled_client(gw: RunningGateway, body: dict[str, object]) -> socket.socket:
    """A client that sends its request and then never reads (a tiny receive window)."""
    url = urlsplit(gw.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((url.hostname, url.port))
    raw = orjson.dumps(body)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: {len(raw)}\r\n"
    sock.sendall(head.encode() + b"content-type: application/json\r\n\r\n" + raw)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed: what it had sent drains to EOF or a reset, then nothing."""
    sock.settimeout(5.0)
    try:
        while sock.recv(1 << 20):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


async def test_a_client_that_stops_reading_is_cut_and_its_upstream_cancelled(
    one_replica: SimFleet,
) -> None:
    cfg = gateway_config(one_replica, server=ServerConfig(port=0, send_timeout_s=SEND_TIMEOUT_S))
    async with running_gateway(cfg) as gw:
        sock = _stalled_client(gw, BIG)
        try:
            await eventually(lambda: _running(one_replica) > 0, what="generation started")
            # Cut at the deadline: the replica stops generating long before the answer is done.
            await eventually(lambda: in_flight(gw) == {"sim-0": 0}, what="in-flight back to 0")
            await eventually(lambda: _running(one_replica) == 0, what="replica aborted it")
            await eventually(lambda: not gw.server.server_state.connections, what="closed")
            assert await asyncio.to_thread(_closed_by_server, sock)
        finally:
            sock.close()


class _Buffered(asyncio.Transport):
    """A transport whose client takes 1,000 bytes between two looks, `reads` times."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.buffered = 100_000
        self.reads = reads
        self.looks = 0
        self.aborted = False
        self.aborted_at = 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        self.looks += 1
        if self.looks > 1 and self.reads:
            self.reads -= 1
            self.buffered -= 1000
        return self.buffered

    def abort(self) -> None:
        self.aborted = True
        self.aborted_at = self.looks

    def close(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _no_app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("no request is parsed in this test")


async def test_a_client_that_reads_slowly_keeps_its_stream() -> None:
    # The rule itself, on a transport whose buffer the test drives: a socket's kernel buffers
    # grow to megabytes for a client that reads, too slow a test to pause the writes for real.
    protocol_class = guarded_protocol(ServerConfig(port=0, send_timeout_s=0.02))
    protocol = protocol_class(uvicorn.Config(app=_no_app, lifespan="off"), ServerState(), {})
    transport = _Buffered(reads=3)
    protocol.connection_made(transport)
    protocol.pause_writing()  # the first look: the mark
    await eventually(lambda: transport.aborted, what="aborted")
    # Looks 2-4 found the client had taken bytes: kept. Look 5 found none: a whole period
    # without progress, cut.
    assert transport.aborted_at == 5
    protocol.connection_lost(None)
