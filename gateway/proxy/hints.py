"""Routing hints a client sends beside the body: tenant and priority, from HTTP or gRPC.

`x-tenant-id` names the tenant (short and plain, else ignored); `x-priority` is an integer
(malformed: 400 / INVALID_ARGUMENT). A body `priority` field wins over the header, since
that is the one vLLM itself reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gateway.errors import BadRequest
from gateway.proxy.requests import ParsedRequest

TENANT = "x-tenant-id"
PRIORITY = "x-priority"
_MAX_HINT = 128


@dataclass(frozen=True, slots=True)
class Hints:
    """What request metadata says: routing hints and the headers to pass on."""

    tenant: str | None = None
    priority: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


def plain(value: str) -> bool:
    """Short, printable and without spaces: safe to use as a label or attribute."""
    return 0 < len(value) <= _MAX_HINT and value.isprintable() and " " not in value


def parse(values: Mapping[str, str], where: str) -> tuple[str | None, int | None]:
    """(tenant, priority) from lower-cased keys; `where` names the carrier in errors."""
    priority: int | None = None
    if PRIORITY in values:
        try:
            priority = int(values[PRIORITY])
        except ValueError:
            raise BadRequest(f"`{PRIORITY}` {where} must be an integer.") from None
    tenant = values.get(TENANT)
    return (tenant if tenant and plain(tenant) else None), priority


def from_headers(headers: list[tuple[bytes, bytes]]) -> Hints:
    """Hints from HTTP request headers (ASGI: lower-cased names)."""
    values: dict[str, str] = {}
    for k, v in headers:
        if k in (b"x-tenant-id", b"x-priority"):
            values.setdefault(k.decode("latin-1"), v.decode("latin-1").strip())
    if not values:
        return Hints()
    tenant, priority = parse(values, "header")
    return Hints(tenant=tenant, priority=priority)


def apply(req: ParsedRequest, hints: Hints) -> ParsedRequest:
    """Tenant and header priority into the routing features (a `priority` field wins)."""
    features = req.features
    if hints.tenant is not None:
        features = replace(features, tenant=hints.tenant)
    if hints.priority is not None and "priority" not in req.data:
        features = replace(features, priority=hints.priority)
    return req if features is req.features else replace(req, features=features)
