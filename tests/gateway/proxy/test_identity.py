"""API keys and request ids shared by the HTTP and gRPC front ends."""

from __future__ import annotations

import pytest

from gateway.proxy.identity import MAX_REQUEST_ID, ApiKeys, request_id


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("Bearer k1", True),
        (b"bearer  k2 ", True),
        ("Bearer k3", False),
        ("Basic k1", False),
        ("k1", False),
        (None, False),
    ],
)
def test_api_keys(value: str | bytes | None, ok: bool) -> None:
    keys = ApiKeys(["k1", "k2"])
    assert keys.enabled
    assert keys.accepts(value) is ok
    assert not ApiKeys([]).enabled


@pytest.mark.parametrize("value", ["abc-1", "x" * MAX_REQUEST_ID])
def test_plain_request_ids_are_kept(value: str) -> None:
    assert request_id(value) == value


@pytest.mark.parametrize("value", [None, "", "has space", "x" * (MAX_REQUEST_ID + 1), "a\nb"])
def test_other_request_ids_are_replaced(value: str | None) -> None:
    rid = request_id(value)
    assert rid != value and len(rid) == 32 and int(rid, 16) >= 0
