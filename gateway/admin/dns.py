"""A small stub resolver: A/AAAA queries to one DNS server over UDP (TCP when truncated).

`[discovery] nameserver` names the server (a cluster's DNS Service, a test's own). Only what
discovery needs: the addresses in the answer section, whatever name owns them (a CNAME's
target comes in the same answer). A name that does not exist, a server failure or an answer
with no address raises OSError, as getaddrinfo does, so a failed round changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import struct

_A, _AAAA, _OPT, _IN = 1, 28, 41, 1
_TYPES = {"ipv4": (_A,), "ipv6": (_AAAA,), "any": (_A, _AAAA)}
# EDNS0: answers up to this size come over UDP (a large headless Service fits).
_UDP_PAYLOAD = 4096
_RCODES = {1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


def encode_query(qid: int, hostname: str, qtype: int) -> bytes:
    """One recursive question for `hostname`, with an EDNS0 record offering _UDP_PAYLOAD."""
    labels = [p.encode("idna") for p in hostname.rstrip(".").split(".")]
    if any(not 0 < len(label) < 64 for label in labels):
        raise OSError(f"{hostname!r} is not a valid DNS name")
    qname = b"".join(bytes([len(label)]) + label for label in labels) + b"\0"
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 1)  # RD; 1 question, 1 additional
    opt = b"\0" + struct.pack("!HHIH", _OPT, _UDP_PAYLOAD, 0, 0)
    return header + qname + struct.pack("!HH", qtype, _IN) + opt


def _skip_name(msg: bytes, pos: int) -> int:
    """The offset just past the (possibly compressed) name at `pos`."""
    while True:
        if pos >= len(msg):
            raise OSError("malformed DNS answer: name runs past the end")
        size = msg[pos]
        if size & 0xC0 == 0xC0:
            return pos + 2  # a pointer ends the name
        if size == 0:
            return pos + 1
        pos += 1 + size


def decode_answer(msg: bytes, qid: int, qtype: int) -> tuple[list[str], bool]:
    """(addresses of type `qtype` in the answer, truncated) from the server's reply."""
    if len(msg) < 12:
        raise OSError("malformed DNS answer: short header")
    rid, flags, qdcount, ancount = struct.unpack_from("!HHHH", msg)
    if rid != qid or not flags & 0x8000:
        raise OSError("DNS answer to another question")
    if flags & 0x0200:
        return [], True
    rcode = flags & 0x000F
    if rcode:
        raise OSError(f"DNS server answered {_RCODES.get(rcode, rcode)}")
    pos = 12
    for _ in range(qdcount):
        pos = _skip_name(msg, pos) + 4
    out: list[str] = []
    for _ in range(ancount):
        pos = _skip_name(msg, pos)
        if pos + 10 > len(msg):
            raise OSError("malformed DNS answer: record runs past the end")
        rtype, rclass, _ttl, size = struct.unpack_from("!HHIH", msg, pos)
        pos += 10
        data = msg[pos : pos + size]
        pos += size
        if len(data) != size:
            raise OSError("malformed DNS answer: record runs past the end")
        if rtype == qtype and rclass == _IN and size in (4, 16):
            out.append(str(ipaddress.ip_address(data)))
    return out, False


class _Reply(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.answer: asyncio.Future[bytes] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.answer.done():
            self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


async def _udp(server: tuple[str, int], query: bytes, wait_s: float) -> bytes:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(wait_s):
        transport, reply = await loop.create_datagram_endpoint(_Reply, remote_addr=server)
        try:
            transport.sendto(query)
            return await reply.answer
        finally:
            transport.close()
            await reply.closed  # the socket is closed a loop turn after close()


async def _tcp(server: tuple[str, int], query: bytes, wait_s: float) -> bytes:
    async with asyncio.timeout(wait_s):
        reader, writer = await asyncio.open_connection(*server)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            (size,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(size)
        finally:
            writer.close()
            with contextlib.suppress(OSError):  # reset by the server: closed all the same
                await writer.wait_closed()


async def _ask(server: tuple[str, int], hostname: str, qtype: int, wait_s: float) -> list[str]:
    qid = secrets.randbelow(65536)
    query = encode_query(qid, hostname, qtype)
    try:
        addresses, truncated = decode_answer(await _udp(server, query, wait_s), qid, qtype)
        if truncated:
            addresses, _ = decode_answer(await _tcp(server, query, wait_s), qid, qtype)
    except (TimeoutError, asyncio.IncompleteReadError) as exc:
        raise OSError(f"no answer from {server[0]}:{server[1]}: {exc or 'timeout'}") from None
    return addresses


async def resolve(server: tuple[str, int], hostname: str, family: str, wait_s: float) -> list[str]:
    """Every address `server` gives for `hostname` (A, AAAA or both), sorted; OSError on none."""
    answers = await asyncio.gather(*(_ask(server, hostname, t, wait_s) for t in _TYPES[family]))
    addresses = sorted({a for answer in answers for a in answer})
    if not addresses:
        raise OSError(f"{hostname} has no address")
    return addresses
