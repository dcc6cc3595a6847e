"""Tenants: keys to tenants, trusted tenant headers, capped classes, lanes, quota refusals."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import orjson
import pytest

from gateway.config import GatewayConfig, ServerConfig, parse_config
from gateway.config_loader import ConfigError, load_dataclass
from gateway.errors import Unauthorized
from gateway.proxy import hints
from gateway.proxy.identity import peer_host
from gateway.proxy.requests import ParsedRequest, parse_request
from gateway.proxy.tenancy import QuotaExceeded, Tenancy
from gateway.proxy.tenancy_config import TenancyConfig, TenantConfig

EXAMPLE = Path(__file__).resolve().parents[3] / "config.example.toml"
LOOPBACK, REMOTE = "127.0.0.1", "203.0.113.7"
CFG = TenancyConfig(
    tenants={
        "acme": TenantConfig(keys=("acme-key",), weight=2.0),
        "ops": TenantConfig(
            keys=("sha256:" + hashlib.sha256(b"ops-key").hexdigest(),),
            priority=1,
            max_priority=0,
        ),
        "batch": TenantConfig(keys=("batch-key",), priority=2, max_priority=2),
        "limited": TenantConfig(keys=("limited-key",), requests_per_minute=1),
    },
    trusted_sources=("127.0.0.0/8",),
)


def _bearer(key: str) -> list[bytes]:
    return [f"Bearer {key}".encode()]


def _bound(
    t: Tenancy, key: str, headers: dict[str, str] | None = None, peer: str = REMOTE, **body: object
) -> ParsedRequest:
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    found = hints.from_headers(raw)
    req = hints.apply(
        parse_request("completions", orjson.dumps({"model": "m", "prompt": "hi", **body}), "r"),
        found,
    )
    return t.bind(req, t.identify(_bearer(key)), found, peer)


def test_keys_name_tenants_and_server_api_keys_are_the_default_tenant() -> None:
    t = Tenancy(CFG, api_keys=("flat-key",))
    assert t.keys_enabled
    assert t.identify(_bearer("acme-key")) == "acme"
    assert t.identify(_bearer("ops-key")) == "ops"  # configured by its digest only
    assert t.identify([b"Basic x", *_bearer("flat-key")]) == "default"
    for bad in ([], _bearer("nope"), [b"acme-key"]):
        with pytest.raises(Unauthorized):
            t.identify(bad)
    # No key anywhere: everyone is the default tenant.
    assert Tenancy(TenancyConfig()).identify([]) == "default"


def test_x_tenant_id_is_honoured_only_from_a_trusted_source() -> None:
    t = Tenancy(CFG)
    forged = {"x-tenant-id": "ops"}
    assert _bound(t, "acme-key", forged, peer=REMOTE).features.tenant == "acme"
    assert _bound(t, "acme-key", forged, peer="::ffff:203.0.113.7").features.tenant == "acme"
    assert _bound(t, "acme-key", forged, peer=LOOPBACK).features.tenant == "ops"
    assert _bound(t, "acme-key", forged, peer="::ffff:127.0.0.1").features.tenant == "ops"
    # Without trusted sources no address is trusted, loopback included.
    untrusting = Tenancy(TenancyConfig(tenants=CFG.tenants))
    assert _bound(untrusting, "acme-key", forged, peer=LOOPBACK).features.tenant == "acme"
    # A trusted name nobody configured: kept for traces, queued and limited as _other.
    req = _bound(t, "acme-key", {"x-tenant-id": "stranger"}, peer=LOOPBACK)
    assert req.features.tenant == "stranger"
    assert t.lane(req.features).tenant == "_other"


@pytest.mark.parametrize(
    ("key", "headers", "body", "cls"),
    [
        ("acme-key", {}, {}, 1),  # the tenant's default class
        ("acme-key", {"x-priority": "P0"}, {}, 1),  # cannot promote itself past max_priority
        ("acme-key", {"x-priority": "p2"}, {}, 2),  # may demote itself
        ("acme-key", {"x-priority": "7"}, {}, 2),  # past the lowest class: the lowest
        ("ops-key", {"x-priority": "P0"}, {}, 0),
        ("ops-key", {"x-priority": "-4"}, {}, 0),
        ("ops-key", {}, {"priority": 0}, 0),  # vLLM's body field asks too (it wins)
        ("ops-key", {"x-priority": "2"}, {"priority": 0}, 0),
        ("batch-key", {"x-priority": "0"}, {}, 2),
        ("batch-key", {}, {}, 2),
    ],
)
def test_the_class_is_asked_for_and_capped_at_the_tenants_best(
    key: str, headers: dict[str, str], body: dict[str, object], cls: int
) -> None:
    t = Tenancy(CFG)
    features = _bound(t, key, headers, **body).features
    assert features.priority == cls
    assert t.lane(features).priority == cls


def test_lanes_carry_the_tenant_weight_and_unbound_requests_are_default() -> None:
    t = Tenancy(CFG)
    lane = t.lane(_bound(t, "acme-key").features)
    assert (lane.tenant, lane.weight, lane.priority) == ("acme", 2.0, 1)
    # The common case is not copied: no tenant is the default one, at its own class.
    plain = parse_request("completions", b'{"model":"m","prompt":"x"}', "r")
    assert t.bind(plain, "default", hints.Hints(), None) is plain
    assert t.lane(plain.features) == type(lane)("default", 1.0, 1)
    assert t.priority(plain.features) == 1
    assert t.labels == ("acme", "batch", "default", "limited", "ops", "_other")


async def test_a_refusal_is_a_429_naming_the_limit_with_retry_after_and_is_counted() -> None:
    refused: list[tuple[str, str]] = []
    now = [0.0]
    t = Tenancy(CFG, on_refused=lambda *a: refused.append(a), clock=lambda: now[0])
    features = _bound(t, "limited-key").features
    grant = await t.reserve(features)
    assert grant is not None and grant.tenant == "limited" and not grant.wants_usage
    with pytest.raises(QuotaExceeded) as info:
        await t.reserve(features)
    err = info.value
    assert err.status == 429 and err.retry_after_s == 60
    assert "requests_per_minute" in err.message and "`limited`" in err.message
    assert orjson.loads(err.body())["error"]["type"] == "RateLimitError"
    assert refused == [("limited", "requests_per_minute")]
    # No limits: no reservation at all.
    assert await t.reserve(_bound(t, "acme-key").features) is None


async def test_the_token_reservation_is_prompt_plus_max_tokens_or_the_default() -> None:
    cfg = TenancyConfig(
        tenants={"t": TenantConfig(keys=("k",), tokens_per_minute=10_000)},
        default_completion_tokens=300,
    )
    t = Tenancy(cfg)
    with_max = _bound(t, "k", max_tokens=50, prompt="x" * 400)
    assert (grant := await t.reserve(with_max.features)) is not None
    assert grant.tokens == 100 + 50 and grant.wants_usage
    assert (grant := await t.reserve(_bound(t, "k", prompt="x" * 400).features)) is not None
    assert grant.tokens == 100 + 300


async def test_a_key_file_maps_keys_and_is_re_read_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# tenant key\nacme file-key-1\n\nops  sha256:" + "ab" * 32 + "  # ops\n")
    t = Tenancy(TenancyConfig(tenants=CFG.tenants, keys_file=str(path)))
    assert t.identify(_bearer("file-key-1")) == "acme"
    assert t.identify(_bearer("acme-key")) == "acme"  # the TOML's keys stay
    path.write_text("acme file-key-2\nstranger k3\nbroken\nops acme-key\n")
    assert t.keys.refresh()
    assert t.identify(_bearer("file-key-2")) == "acme"
    for gone in ("file-key-1", "k3"):  # replaced; an unknown tenant's line is skipped
        with pytest.raises(Unauthorized):
            t.identify(_bearer(gone))
    assert t.identify(_bearer("acme-key")) == "acme"  # another tenant's key is not taken over
    path.unlink()
    assert not t.keys.refresh()  # unreadable now: the last keys stay
    assert t.identify(_bearer("file-key-2")) == "acme"


async def test_a_key_file_never_adds_an_admin_key_and_must_exist_at_start(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("acme admin-key\nacme ok-key\n")
    t = Tenancy(TenancyConfig(tenants=CFG.tenants, keys_file=str(path)), admin_keys=("admin-key",))
    assert t.identify(_bearer("ok-key")) == "acme"
    with pytest.raises(Unauthorized):
        t.identify(_bearer("admin-key"))
    with pytest.raises(ConfigError, match="keys_file"):
        Tenancy(TenancyConfig(keys_file=str(tmp_path / "missing")))


async def test_the_key_file_is_checked_at_most_once_per_interval_off_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys"
    path.write_text("acme first\n")
    now = [100.0]
    cfg = TenancyConfig(tenants=CFG.tenants, keys_file=str(path), keys_file_check_s=1.0)
    t = Tenancy(cfg, clock=lambda: now[0])  # read at start: the next check is due at 101
    path.write_text("acme second\n")
    now[0] += 0.5
    assert t.identify(_bearer("first")) == "acme"
    with pytest.raises(Unauthorized):  # within the interval: the file is not even looked at
        t.identify(_bearer("second"))
    assert t._refreshing is None
    now[0] += 0.6
    assert t.identify(_bearer("acme-key")) == "acme"  # due now: checked in a worker thread
    assert t._refreshing is not None
    assert await t._refreshing
    assert t.identify(_bearer("second")) == "acme"
    with pytest.raises(Unauthorized):
        t.identify(_bearer("first"))
    first = t._refreshing
    now[0] += 0.5
    t.identify(_bearer("second"))
    assert t._refreshing is first  # no second check within the interval


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"tenants": {"_other": {}}}, "tenant name"),
        ({"tenants": {"a b": {}}}, "tenant name"),
        ({"tenants": {"t": {"weight": 0}}}, "weight"),
        ({"tenants": {"t": {"priority": 3}}}, "0..2"),
        ({"tenants": {"t": {"priority": 0}}}, "better than max_priority"),
        ({"tenants": {"t": {"requests_per_minute": -1}}}, "requests_per_minute"),
        ({"tenants": {"t": {"color": "red"}}}, "color"),
        ({"trusted_sources": ["10.0.0.0/33"]}, "trusted_sources"),
        ({"default_completion_tokens": 0}, "default_completion_tokens"),
        ({"tenants": {"a": {"keys": ["k"]}, "b": {"keys": ["k"]}}}, "also 'a'"),
    ],
)
def test_bad_tenancy_tables_are_refused(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({"tenancy": table})


def test_a_tenant_key_may_not_be_an_admin_or_another_tenants_flat_key() -> None:
    tenancy = load_dataclass(TenancyConfig, {"tenants": {"t": {"keys": ["k"]}}})
    with pytest.raises(ValueError, match="admin key"):
        GatewayConfig(server=ServerConfig(admin_keys=("k",)), tenancy=tenancy)
    with pytest.raises(ValueError, match="'default'"):
        GatewayConfig(server=ServerConfig(api_keys=("k",)), tenancy=tenancy)


def test_the_example_tenant_table_is_valid_and_at_the_defaults() -> None:
    text = EXAMPLE.read_text()
    sample = text[text.index("# [tenancy.tenants.acme]") :].split("\n\n", 1)[0]
    table = tomllib.loads("\n".join(line.removeprefix("# ") for line in sample.splitlines()))
    acme = table["tenancy"]["tenants"]["acme"]
    cfg = parse_config(table).tenancy.tenants["acme"]
    assert {f for f in TenantConfig.__dataclass_fields__} == set(acme)
    defaults = TenantConfig()
    for name in acme:
        if name != "keys":
            assert getattr(cfg, name) == getattr(defaults, name), name


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:5000", "127.0.0.1"),
        ("ipv6:[::1]:5000", "::1"),
        ("unix:/tmp/s", None),
        ("", None),
    ],
)
def test_peer_host(peer: str, host: str | None) -> None:
    assert peer_host(peer) == host
