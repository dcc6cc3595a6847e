"""The features' positional copy is dataclasses.replace, field for field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.proxy.headers import client_response_headers
from gateway.proxy.http_response import ResponseHeaders
from gateway.proxy.requests import with_features
from routing.types import RequestFeatures

BASE = RequestFeatures(model="m", request_id="r", prompt_tokens=7, hints={"arch": "int4"})


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(RequestFeatures)])
def test_with_features_changes_exactly_the_named_field(field: str) -> None:
    value: Any = object()
    copied = with_features(BASE, **{field: value})
    assert copied == dataclasses.replace(BASE, **{field: value})
    assert getattr(copied, field) is value
    assert BASE.model == "m"  # the original is untouched


def test_with_features_refuses_an_unknown_field() -> None:
    with pytest.raises(TypeError, match="no field 'colour'"):
        with_features(BASE, colour="red")


def test_response_headers_drop_what_a_connection_header_names_and_set_the_id() -> None:
    out = client_response_headers(
        [("Content-Type", "application/json"), ("X-Request-Id", "theirs"), ("Server", "nginx")],
        "ours",
    )
    assert out == [(b"content-type", b"application/json"), (b"x-request-id", b"ours")]
    named = client_response_headers(
        [("Connection", "keep-alive, x-secret"), ("X-Secret", "1")], "r"
    )
    assert named == [(b"x-request-id", b"r")]


def test_upstream_headers_go_back_as_received_without_a_decode() -> None:
    raw = [
        (b"content-type", b"application/json"),
        (b"connection", b"keep-alive, x-secret"),
        (b"x-secret", b"1"),
        (b"x-note", b"caf\xe9"),
    ]
    headers = ResponseHeaders(raw)
    assert headers["Content-Type"] == "application/json" and headers.get("x-note") == "café"
    assert list(headers.items()) == [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
    assert headers.items()[1:2] == [("connection", "keep-alive, x-secret")]
    out = client_response_headers(headers.items(), "r")
    assert out == [raw[0], raw[3], (b"x-request-id", b"r")]
    # The very pairs the client parsed: nothing decoded and encoded again on the way.
    assert out[0] is raw[0] and out[1] is raw[3]
    # The same answer from pairs of str (another Upstream) is converted to the same bytes.
    assert client_response_headers(list(headers.items()), "r") == out
