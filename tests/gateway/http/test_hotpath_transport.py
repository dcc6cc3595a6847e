"""The connection's transport: a response head goes out with its body's first bytes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from gateway.http.transport import LingeringTransport


class _Raw(asyncio.Transport):
    """Records what reaches the socket: one entry per send."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.eof = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sends.append(bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.sends.append(b"".join(bytes(d) for d in list_of_data))

    def write_eof(self) -> None:
        self.eof = True
        self.sends.append(b"<eof>")


class _Protocol:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closes = 0

    def close_requested(self) -> None:
        self.closes += 1


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_a_head_and_its_body_are_one_send() -> None:
    raw = _Raw()
    t = LingeringTransport(raw, _Protocol())
    t.write(HEAD)
    assert raw.sends == []
    t.write(b"{}")
    assert raw.sends == [HEAD + b"{}"]
    t.write(b"more")  # nothing held now: straight through
    assert raw.sends == [HEAD + b"{}", b"more"]


async def test_a_head_without_a_body_goes_out_on_the_next_loop_turn() -> None:
    raw = _Raw()
    t = LingeringTransport(raw, _Protocol())
    t.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    await asyncio.sleep(0)  # one loop iteration: the scheduled flush runs
    assert raw.sends == [b"HTTP/1.1 204 No Content\r\n\r\n"]


async def test_a_held_head_is_sent_before_an_eof_or_other_writes() -> None:
    raw = _Raw()
    t = LingeringTransport(raw, _Protocol())
    t.write(HEAD)
    t.writelines([b"a", b"b"])
    t.write(HEAD)
    t.write_eof()
    assert raw.sends == [HEAD, b"ab", HEAD, b"<eof>"]
    await asyncio.sleep(0)
    assert len(raw.sends) == 4  # the scheduled flushes found nothing left


async def test_close_is_the_protocols_to_decide() -> None:
    proto = _Protocol()
    t = LingeringTransport(_Raw(), proto)
    t.close()
    t.close()
    assert proto.closes == 1
    assert t.is_closing()
