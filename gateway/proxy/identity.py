"""Who is calling and which request this is: API keys, tenant keys, request ids, addresses."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import re
from collections.abc import Collection, Iterable, Mapping
from random import getrandbits

from gateway.config_loader import ConfigError

log = logging.getLogger("llm_gateway.identity")

# Client-chosen request ids are echoed into logs and upstream headers: keep them short and plain.
MAX_REQUEST_ID = 128

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")


def new_request_id() -> str:
    """A fresh 32-hex-digit id: 128 random bits from the random module's generator."""
    # Unique, not secret: os.urandom was a getrandom syscall per request (~2 us under load).
    # The module's generator is seeded from the OS, and reseeded in a forked child.
    return f"{getrandbits(128):032x}"


def request_id(value: str | None) -> str:
    """The client's id when it is short and plain, else a fresh one."""
    if value and len(value) <= MAX_REQUEST_ID and value.isprintable() and " " not in value:
        return value
    return new_request_id()


def key_digest(key: str) -> bytes:
    """The SHA-256 digest a configured key is kept as; `sha256:<hex>` gives the digest itself."""
    match = _DIGEST.fullmatch(key)
    if match is not None:
        return bytes.fromhex(match[1])
    return hashlib.sha256(key.encode()).digest()


def bearer_digest(authorization: str | bytes | None) -> bytes | None:
    """The SHA-256 of the key in an `Authorization: Bearer <key>` value; None if not one."""
    if authorization is None:
        return None
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    if raw[:7].lower() != b"bearer ":
        return None
    return hashlib.sha256(raw[7:].strip()).digest()


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
        return bearer_digest(authorization) in self._digests

    def in_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """True when an `Authorization` header among raw ASGI `headers` holds a configured key."""
        return any(k == b"authorization" and self.accepts(v) for k, v in headers)


class TenantKeys:
    """Key digest -> tenant: the configured keys, plus a keys file re-read when it changes.

    The file holds `tenant key` lines (`#` starts a comment; a key may be `sha256:<hex>`).
    `refresh` does file I/O: the caller runs it off the event loop. A line naming an unknown
    tenant, an admin key, or a key of another tenant is skipped (and logged, without the key).
    """

    def __init__(
        self,
        static: Mapping[bytes, str],
        path: str = "",
        tenants: Collection[str] = (),
        refused: Collection[bytes] = (),
    ) -> None:
        self.path = path
        self._static = dict(static)
        self._tenants = frozenset(tenants)
        self._refused = frozenset(refused)
        self._keys = self._static
        self._stamp: tuple[int, int, int] | None = None
        if path and not self.refresh():
            raise ConfigError(f"tenancy.keys_file: cannot read {path}")

    @property
    def enabled(self) -> bool:
        """Keys are required: some are configured, or a keys file is."""
        return bool(self._static) or bool(self.path)

    def tenant_of(self, authorization: str | bytes | None) -> str | None:
        """The tenant whose key an `Authorization: Bearer <key>` value holds, or None."""
        digest = bearer_digest(authorization)
        return None if digest is None else self._keys.get(digest)

    def refresh(self) -> bool:
        """Re-read the keys file if it changed since the last read; False if it is unreadable."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return True
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("tenancy.keys_file %s: not read (%s); keys kept", self.path, exc)
            return False
        keys = dict(self._static)
        for n, line in enumerate(lines, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2:
                log.warning("%s:%d: expected `tenant key`; line skipped", self.path, n)
                continue
            tenant, digest = fields[0], key_digest(fields[1])
            if tenant not in self._tenants:
                log.warning("%s:%d: unknown tenant %r; line skipped", self.path, n, tenant)
            elif digest in self._refused:
                log.error("%s:%d: an admin key cannot be a tenant key; skipped", self.path, n)
            elif keys.setdefault(digest, tenant) != tenant:
                log.warning("%s:%d: the key is another tenant's; line skipped", self.path, n)
        # One reference swap: a reader on the event loop sees the old map or the new one.
        self._keys = keys
        self._stamp = stamp
        log.info("tenancy.keys_file %s: %d keys", self.path, len(keys) - len(self._static))
        return True


def peer_host(peer: str | None) -> str | None:
    """The address of a gRPC peer (`ipv4:1.2.3.4:5`, `ipv6:[::1]:5`); None for other kinds."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        host = rest.rpartition(":")[0]
        return host.strip("[]") or None
    return None


def _address(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if host is None:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a Unix socket path or a name: not provably any address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def in_networks(host: str | None, networks: Iterable[Network]) -> bool:
    """True when `host` (IPv4, IPv6 or IPv4-mapped IPv6) lies in one of `networks`."""
    address = _address(host)
    return address is not None and any(address in net for net in networks)


def is_loopback(host: str | None) -> bool:
    """True for a loopback client address (IPv4, IPv6 or IPv4-mapped IPv6); False if unknown."""
    address = _address(host)
    return address is not None and address.is_loopback
