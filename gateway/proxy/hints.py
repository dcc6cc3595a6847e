"""Routing hints a client sends beside the body: tenant, priority, model hints; HTTP or gRPC.

`x-tenant-id` names the tenant (short and plain, else ignored; honoured only from trusted
sources, see gateway/proxy/tenancy.py); `x-priority` (or its alias `x-llm-priority`; both
present must agree) is an integer or a class name, `P1` = 1 (malformed: 400 /
INVALID_ARGUMENT). A body `priority` field wins over the header, since that is the one vLLM
itself reads. `x-canary-weight` (0..100) asks for the canaries' share of a model's versions;
the version stage (gateway/proxy/versions.py) honours it only where `[traffic]` allows.

`x-model-hint` asks for replica labels (matched by the `label` filter of a routing profile
that has one): comma-separated `key=value` pairs, e.g.
`x-model-hint: arch=int4, precision=fp8` -> {"arch": "int4", "precision": "fp8"}.
At most 8 pairs with distinct keys; keys up to 32 and values up to 64 characters of
A-Z a-z 0-9 . _ - (case-sensitive, compared with the labels as they are); spaces around
items and `=` are ignored, and so are empty items. Repeated headers (or metadata entries)
add up, as HTTP list headers do. Anything else is malformed: 400 / INVALID_ARGUMENT.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gateway.errors import BadRequest
from gateway.proxy.requests import ParsedRequest

TENANT = "x-tenant-id"
PRIORITY = "x-priority"
PRIORITY_ALIAS = "x-llm-priority"
CANARY_WEIGHT = "x-canary-weight"
MODEL_HINT = "x-model-hint"
_MAX_HINT = 128
MAX_MODEL_HINTS = 8
_PAIR = re.compile(r"\s*([A-Za-z0-9._-]{1,32})\s*=\s*([A-Za-z0-9._-]{1,64})\s*")
# Bounds the work on a hostile header before it is split: 8 full pairs with some spaces.
_MAX_MODEL_HINT_CHARS = 1024
_MODEL_HINT_SYNTAX = (
    f"`{MODEL_HINT}` {{where}} must be up to {MAX_MODEL_HINTS} comma-separated key=value pairs "
    "with distinct keys (keys up to 32, values up to 64 characters of A-Z a-z 0-9 . _ -)."
)
_HEADER_KEYS = frozenset(
    k.encode() for k in (TENANT, PRIORITY, PRIORITY_ALIAS, MODEL_HINT, CANARY_WEIGHT)
)


@dataclass(frozen=True, slots=True)
class Hints:
    """What request metadata says: routing hints and the headers to pass on."""

    tenant: str | None = None
    priority: int | None = None
    # x-model-hint: the replica labels the request asks for (RequestFeatures.hints).
    labels: Mapping[str, str] = field(default_factory=dict)
    # x-canary-weight: the canaries' share the client asks for (RequestFeatures.canary_weight).
    canary_weight: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


def plain(value: str) -> bool:
    """Short, printable and without spaces: safe to use as a label or attribute."""
    return 0 < len(value) <= _MAX_HINT and value.isprintable() and " " not in value


def model_hints(value: str, where: str) -> dict[str, str]:
    """`arch=int4, precision=fp8` -> {"arch": "int4", "precision": "fp8"}; malformed: 400."""
    malformed = BadRequest(_MODEL_HINT_SYNTAX.format(where=where))
    if len(value) > _MAX_MODEL_HINT_CHARS:
        raise malformed
    pairs: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue  # an empty list element (RFC 9110 5.6.1), e.g. of an empty repeat
        match = _PAIR.fullmatch(item)
        if match is None or match[1] in pairs or len(pairs) == MAX_MODEL_HINTS:
            raise malformed
        pairs[match[1]] = match[2]
    return pairs


def collect(values: dict[str, str], key: str, value: str) -> None:
    """Record one header or metadata entry: the first wins, but x-model-hint repeats add up."""
    if key == MODEL_HINT and key in values:
        values[key] += "," + value
    else:
        values.setdefault(key, value)


def parse(values: Mapping[str, str], where: str) -> Hints:
    """Hints from lower-cased keys (no headers to pass on); `where` names the carrier in errors."""
    priority: int | None = None
    for key in (PRIORITY, PRIORITY_ALIAS):
        if key not in values:
            continue
        raw = values[key]
        try:
            # A class name (P0..P2) or vLLM's integer priority.
            value = int(raw[1:] if raw[:1] in ("P", "p") else raw)
        except ValueError:
            raise BadRequest(f"`{key}` {where} must be an integer or P0..P2.") from None
        if priority is not None and value != priority:
            raise BadRequest(f"`{PRIORITY}` and `{PRIORITY_ALIAS}` {where} disagree.")
        priority = value
    canary: int | None = None
    if CANARY_WEIGHT in values:
        raw = values[CANARY_WEIGHT]
        canary = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 3 else -1
        if not 0 <= canary <= 100:
            raise BadRequest(f"`{CANARY_WEIGHT}` {where} must be an integer from 0 to 100.")
    tenant = values.get(TENANT)
    labels = model_hints(values[MODEL_HINT], where) if MODEL_HINT in values else {}
    return Hints(
        tenant=tenant if tenant and plain(tenant) else None,
        priority=priority,
        labels=labels,
        canary_weight=canary,
    )


def from_headers(headers: list[tuple[bytes, bytes]]) -> Hints:
    """Hints from HTTP request headers (ASGI: lower-cased names)."""
    values: dict[str, str] = {}
    for k, v in headers:
        if k in _HEADER_KEYS:
            collect(values, k.decode("latin-1"), v.decode("latin-1").strip())
    return parse(values, "header") if values else Hints()


def apply(req: ParsedRequest, hints: Hints) -> ParsedRequest:
    """Tenant, header priority and model hints into the features (a `priority` field wins)."""
    features = req.features
    if hints.tenant is not None:
        features = replace(features, tenant=hints.tenant)
    if hints.labels:
        features = replace(features, hints=hints.labels)
    if hints.canary_weight is not None:
        features = replace(features, canary_weight=hints.canary_weight)
    if hints.priority is not None and "priority" not in req.data:
        features = replace(features, priority=hints.priority)
    return req if features is req.features else replace(req, features=features)
