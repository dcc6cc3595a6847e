"""Who is calling and which request this is: API keys and request ids, for every front end."""

from __future__ import annotations

import hashlib
import ipaddress
import os
from collections.abc import Iterable

# Client-chosen request ids are echoed into logs and upstream headers: keep them short and plain.
MAX_REQUEST_ID = 128


def new_request_id() -> str:
    """A fresh 32-hex-digit id (os.urandom: cheaper than uuid4 on the hot path)."""
    return os.urandom(16).hex()


def request_id(value: str | None) -> str:
    """The client's id when it is short and plain, else a fresh one."""
    if value and len(value) <= MAX_REQUEST_ID and value.isprintable() and " " not in value:
        return value
    return new_request_id()


class ApiKeys:
    """Gateway API keys, looked up by hash: no timing signal about how much of a key matched."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = frozenset(hashlib.sha256(k.encode()).digest() for k in keys)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, authorization: str | bytes | None) -> bool:
        """True for an `Authorization: Bearer <key>` value holding a configured key."""
        if authorization is None:
            return False
        raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
        if raw[:7].lower() != b"bearer ":
            return False
        return hashlib.sha256(raw[7:].strip()).digest() in self._digests

    def in_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """True when an `Authorization` header among raw ASGI `headers` holds a configured key."""
        return any(k == b"authorization" and self.accepts(v) for k, v in headers)


def is_loopback(host: str | None) -> bool:
    """True for a loopback client address (IPv4, IPv6 or IPv4-mapped IPv6); False if unknown."""
    if host is None:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a Unix socket path or a name: not provably this host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
