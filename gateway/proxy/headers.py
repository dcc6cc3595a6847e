"""Which headers cross the gateway, in each direction."""

from __future__ import annotations

from collections.abc import Iterable

# RFC 9110 §7.6.1 hop-by-hop headers, plus the de-facto Proxy-Connection and Keep-Alive.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Set by the gateway itself (or by the HTTP client library) rather than copied.
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"authorization", b"expect"}
_RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"server", b"date"}


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    named: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            named.update(t.strip().lower() for t in v.split(b",") if t.strip())
    return frozenset(named)


def upstream_request_headers(
    client_headers: list[tuple[bytes, bytes]], request_id: str, api_key: str
) -> dict[str, str]:
    """Client headers minus hop-by-hop and credentials, plus the request id and upstream key."""
    drop = _REQUEST_DROP | _connection_named(client_headers)
    out: dict[str, str] = {}
    for k, v in client_headers:
        kl = k.lower()
        if kl in drop or kl == b"x-request-id":
            continue
        out[kl.decode("latin-1")] = v.decode("latin-1")
    out["x-request-id"] = request_id
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def client_response_headers(
    upstream_headers: Iterable[tuple[str, str]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """Upstream response headers minus hop-by-hop, with the request id."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in upstream_headers]
    drop = _RESPONSE_DROP | _connection_named(raw) | {b"x-request-id"}
    out = [(k, v) for k, v in raw if k not in drop]
    out.append((b"x-request-id", request_id.encode("latin-1")))
    return out
