"""Which headers cross the gateway, in each direction."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from gateway.proxy.http_response import HeaderItems

# RFC 9110 §7.6.1 hop-by-hop headers, plus the de-facto Proxy-Connection and Keep-Alive.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Credentials meant for the gateway or the client's own session: upstream only when configured.
CREDENTIALS = frozenset({b"authorization", b"proxy-authorization", b"cookie", b"x-api-key"})
# Set by the gateway itself (or by the HTTP client library) rather than copied.
_GATEWAY_SET = frozenset(
    {
        b"host",
        b"content-length",
        b"expect",
        b"x-request-id",
        b"x-forwarded-for",
        b"x-forwarded-proto",
    }
)
_REQUEST_DROP = HOP_BY_HOP | CREDENTIALS | _GATEWAY_SET
_RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"server", b"date", b"proxy-authorization"}
# The gateway sets the answer's x-request-id itself.
_RESPONSE_DROP_RID = _RESPONSE_DROP | {b"x-request-id"}
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class FrontHeaders(list[tuple[bytes, bytes]]):
    """A client's headers after the front end's ForwardPolicy: all of them may go upstream."""

    __slots__ = ()


def check_forwarding(forward_headers: Iterable[str], trusted_proxies: Iterable[str]) -> None:
    """Refuse (ValueError) a header the gateway must own, or a CIDR that does not parse."""
    for name in forward_headers:
        key = name.strip().lower().encode("latin-1")
        if not key or key in HOP_BY_HOP or key in _GATEWAY_SET:
            raise ValueError(f"forward_headers: {name!r} is hop-by-hop or set by the gateway")
    for cidr in trusted_proxies:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ValueError(f"trusted_proxies: {cidr!r} is not an address or CIDR") from None


class ForwardPolicy:
    """What of a client's request head reaches a replica: sets built once, one pass a request."""

    __slots__ = ("_drop", "_nets")

    def __init__(self, forward_headers: Iterable[str], trusted_proxies: Iterable[str]) -> None:
        check_forwarding(forward_headers, trusted_proxies)
        allowed = {n.strip().lower().encode("latin-1") for n in forward_headers}
        self._drop = _REQUEST_DROP - allowed
        self._nets: tuple[_Network, ...] = tuple(
            ipaddress.ip_network(c, strict=False) for c in trusted_proxies
        )

    def _trusted(self, peer: str | None) -> bool:
        if not self._nets or peer is None:
            return False
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(addr in net for net in self._nets)

    def apply(
        self, headers: list[tuple[bytes, bytes]], peer: str | None, scheme: str
    ) -> FrontHeaders:
        """`headers` (ASGI: lower-cased) as they may go upstream, with X-Forwarded-For/-Proto."""
        drop = self._drop
        out = FrontHeaders()
        named: list[bytes] = []
        forwarded_for: list[bytes] = []
        proto: bytes | None = None
        for k, v in headers:
            if k not in drop:
                out.append((k, v))
            elif k == b"connection":
                for token in v.split(b","):
                    token = token.strip().lower()
                    if token not in drop:  # keep-alive, close: dropped anyway
                        named.append(token)
            elif k == b"x-forwarded-for":
                forwarded_for.append(v.strip())
            elif k == b"x-forwarded-proto":
                proto = v.strip()
        if named:
            gone = frozenset(named)
            out[:] = [(k, v) for k, v in out if k not in gone]
        # A client's own X-Forwarded-* is a claim: kept only from a proxy we were told to trust.
        trusted = bool(forwarded_for or proto) and self._trusted(peer)
        if peer is not None:
            hop = peer.encode("latin-1")
            chain = b", ".join([*forwarded_for, hop]) if trusted and forwarded_for else hop
            out.append((b"x-forwarded-for", chain))
        out.append((b"x-forwarded-proto", proto if trusted and proto else scheme.encode("latin-1")))
        return out


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    named: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            named.update(t.strip().lower() for t in v.split(b",") if t.strip())
    return frozenset(named)


def upstream_request_headers(
    client_headers: list[tuple[bytes, bytes]], request_id: str, api_key: str
) -> dict[str, str]:
    """Client headers minus hop-by-hop and credentials, plus the request id and upstream key.

    Headers already through a ForwardPolicy (FrontHeaders) are taken as they are; any other
    list gets the default: no credential, no X-Forwarded-*, nothing hop-by-hop.
    """
    if type(client_headers) is FrontHeaders:
        out = {k.decode("latin-1"): v.decode("latin-1") for k, v in client_headers}
    else:
        drop = _REQUEST_DROP | _connection_named(client_headers)
        out = {}
        for k, v in client_headers:
            kl = k.lower()
            if kl not in drop:
                out[kl.decode("latin-1")] = v.decode("latin-1")
    out["x-request-id"] = request_id
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def client_response_headers(
    upstream_headers: Iterable[tuple[str, str]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """Upstream response headers minus hop-by-hop, with the request id."""
    if type(upstream_headers) is HeaderItems:
        raw = upstream_headers.raw  # as the replica sent them, names lower-cased
    else:
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in upstream_headers]
    drop = _RESPONSE_DROP_RID
    if any(k == b"connection" for k, _ in raw):
        drop = drop | _connection_named(raw)
    out = [pair for pair in raw if pair[0] not in drop]
    out.append((b"x-request-id", request_id.encode("latin-1")))
    return out
