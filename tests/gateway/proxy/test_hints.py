from __future__ import annotations

import orjson
import pytest

from gateway.errors import BadRequest
from gateway.proxy import hints
from gateway.proxy.requests import parse_request


def _req(**extra: object) -> object:
    body = {"model": "m", "prompt": "hi", **extra}
    return parse_request("completions", orjson.dumps(body), "r1")


def test_tenant_and_priority_headers_become_routing_features() -> None:
    h = hints.from_headers([(b"x-tenant-id", b"acme"), (b"x-priority", b" 7 "), (b"a", b"b")])
    assert (h.tenant, h.priority) == ("acme", 7)
    req = hints.apply(_req(), h)  # type: ignore[arg-type]
    assert (req.features.tenant, req.features.priority) == ("acme", 7)


def test_the_body_priority_wins_and_odd_tenants_are_ignored() -> None:
    h = hints.from_headers([(b"x-tenant-id", b"two words"), (b"x-priority", b"9")])
    assert h.tenant is None
    req = hints.apply(_req(priority=1), h)  # type: ignore[arg-type]
    assert (req.features.tenant, req.features.priority) == (None, 1)
    assert hints.from_headers([(b"x-tenant-id", b"x" * 129)]).tenant is None


def test_no_hint_headers_leave_the_request_as_it_is() -> None:
    req = _req()
    assert hints.apply(req, hints.from_headers([(b"host", b"x")])) is req  # type: ignore[arg-type]


def test_a_malformed_priority_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="`x-priority` header must be an integer"):
        hints.from_headers([(b"x-priority", b"high")])
