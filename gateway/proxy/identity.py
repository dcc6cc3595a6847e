"""Who is calling and which request this is: API keys and request ids, for every front end."""

from __future__ import annotations

import hashlib
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
