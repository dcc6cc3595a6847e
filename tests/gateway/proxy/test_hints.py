from __future__ import annotations

import orjson
import pytest

from gateway.config import CacheIndexConfig
from gateway.errors import BadRequest
from gateway.grpc.convert import read_hints
from gateway.proxy import hints
from gateway.proxy.affinity import Affinity
from gateway.proxy.requests import parse_request
from routing import PLUGINS, ReplicaSnapshot


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


def test_the_model_hint_header_is_key_value_pairs() -> None:
    h = hints.from_headers([(b"x-model-hint", b"arch=int4, precision=fp8")])
    assert h.labels == {"arch": "int4", "precision": "fp8"}
    spaced = hints.from_headers([(b"x-model-hint", b" arch = int4 ,, gpu.type=H100_sxm-5 ,")])
    assert spaced.labels == {"arch": "int4", "gpu.type": "H100_sxm-5"}
    # Repeats add up, as an HTTP list header's do; an empty one asks for nothing.
    repeated = hints.from_headers([(b"x-model-hint", b"arch=int4"), (b"x-model-hint", b"b=2")])
    assert repeated.labels == {"arch": "int4", "b": "2"}
    assert hints.from_headers([(b"x-model-hint", b" ")]).labels == {}
    eight = ",".join(f"k{i}=v{i}" for i in range(8)).encode()
    assert len(hints.from_headers([(b"x-model-hint", eight)]).labels) == 8
    assert hints.from_headers([(b"x-model-hint", b"k" * 32 + b"=" + b"v" * 64)]).labels


@pytest.mark.parametrize(
    "value",
    [
        "arch",  # no value
        "=int4",
        "arch=",
        "arch=int4=fp8",
        "two words=x",
        "arch=int 4",
        "arch=int4; precision=fp8",
        "arch=int4,arch=fp8",  # a repeated key is ambiguous
        ",".join(f"k{i}=v{i}" for i in range(9)),  # more than 8 pairs
        "k" * 33 + "=v",
        "k=" + "v" * 65,
        "ärch=int4",
        "a=b," + " " * 2000 + "c=d",  # longer than any valid hint, whatever it holds
    ],
)
def test_a_malformed_model_hint_is_a_bad_request_in_vllms_shape(value: str) -> None:
    with pytest.raises(BadRequest, match="`x-model-hint` header must be") as info:
        hints.from_headers([(b"x-model-hint", value.encode("latin-1", "replace"))])
    err = info.value
    assert err.status == 400
    body = orjson.loads(err.body())
    assert body == {
        "error": {"message": err.message, "type": "BadRequestError", "param": None, "code": 400}
    }
    assert "up to 8 comma-separated key=value pairs" in err.message


def test_model_hints_come_from_grpc_metadata_alike() -> None:
    meta: list[tuple[str, str | bytes]] = [
        ("x-model-hint", "arch=int4"),
        ("x-model-hint", "precision=fp8"),
        ("x-tenant-id", "acme"),
    ]
    h = read_hints(meta)
    assert (h.labels, h.tenant) == ({"arch": "int4", "precision": "fp8"}, "acme")
    assert (b"x-model-hint", b"arch=int4") in h.headers  # passed on like any header
    with pytest.raises(BadRequest, match="`x-model-hint` metadata must be"):
        read_hints([("x-model-hint", "arch")])


def test_the_label_filter_picks_the_replica_the_header_asks_for() -> None:
    fleet = [
        ReplicaSnapshot("fp16", "http://fp16", frozenset({"m"}), labels={"precision": "fp16"}),
        ReplicaSnapshot("int4", "http://int4", frozenset({"m"}), labels={"precision": "int4"}),
        ReplicaSnapshot("bare", "http://bare", frozenset({"m"})),
    ]
    headers = [(b"x-model-hint", b"precision=int4")]
    req = hints.apply(_req(), hints.from_headers(headers))  # type: ignore[arg-type]
    # The cache-index lookup completes the features and keeps the hints.
    affinity = Affinity(CacheIndexConfig(tokenizer=""), is_lora=lambda m: False)
    features = affinity.features(req, headers)
    assert features.hints == {"precision": "int4"}
    label = PLUGINS["label"].build({})
    assert [r.name for r in label.filter(features, fleet)] == ["int4"]
    assert [r.name for r in label.filter(_req().features, fleet)] == ["fp16", "int4", "bare"]  # type: ignore[attr-defined]
